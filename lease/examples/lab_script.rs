//! A lab script's use of the lease engine: only one worker imports dataset 42 at a time, and at
//! most two stations ramp at once. Run it as often as you like in parallel:
//!
//! ```text
//! cargo run -p station-lease --example lab_script -- sqlite:/tmp/lab-leases.db
//! cargo run -p station-lease --example lab_script -- postgres://postgres@127.0.0.1/test
//! cargo run -p station-lease --example lab_script -- redis://127.0.0.1:6379
//! ```

use std::time::Duration;

use station_lease::{BackendUrl, Lease, LeaseGuardError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite:/tmp/lab-leases.db".into());
    let store = BackendUrl::parse(&url)?.open().await?;
    let worker = format!("worker {}", std::process::id());

    // An exclusive lease: wait up to 10 s for it; the guard releases it at the end.
    let import = Lease::exclusive(store.clone(), "dataset-42", Duration::from_secs(30))
        .with_owner(worker.clone());
    let guard = match import.guard(true, Some(Duration::from_secs(10))).await {
        Ok(guard) => guard,
        Err(LeaseGuardError::LeaseNotAcquired { holder, .. }) => {
            println!("dataset 42 is busy: {holder:?}");
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    // Hand the fence to whatever the lease protects, so a late write of a stalled holder can be
    // told apart; keep the token to resume the lease if this script is restarted
    // (`Lease::with_owner_token`).
    println!(
        "{worker} imports dataset 42 under fence {:?}",
        guard.fence()
    );
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await; // a step of the import
        // A lease never renews itself: refresh it before its TTL passes, or lose it.
        if !guard.refresh(None).await? {
            return Err("the dataset-42 lease ran out during the import".into());
        }
    }
    guard.release().await?;

    // A semaphore: at most two stations ramp at once. Every holder must ask with the same
    // number of slots while it has holders.
    let ramp = Lease::semaphore(store, "ramp", 2, Duration::from_secs(30)).with_owner(worker);
    if ramp.acquire(true, Some(Duration::from_secs(10))).await? {
        let slot = ramp.grant().map(|grant| grant.slot);
        println!("ramping in slot {slot:?}");
        ramp.release().await?;
    }
    Ok(())
}

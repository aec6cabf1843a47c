//! Test-only: holes the project has fixed, put back one by name at run time, so that the lab's
//! deterministic simulation (`station-dst --reintroduce NAME`) can show it finds them. Compiled
//! to nothing without the `reintroduce-holes` feature: [`active`] is then `false` wherever it
//! is asked, and the optimiser drops the hole's code.

/// The holes that can be put back, each with what it undoes.
pub const HOLES: &[(&str, &str)] = &[
    (
        "safe-state-tried-once",
        "the safe state tried once, then given up",
    ),
    (
        "renewal-confirmed-late",
        "a renewal the store confirmed after the lease's deadline extends it (the renewal gap)",
    ),
    (
        "lease-less-doubt",
        "a change left in doubt does not withhold the next grant",
    ),
    (
        "lock-delay-lost",
        "the lock-delay kept in the station's ledger is lost on a restart or a takeover",
    ),
    (
        "end-without-settle",
        "a lease's end waits for none of its changes still at the station",
    ),
    (
        "transition-in-request",
        "a lease's transition lives in its request's future (a release whose client hung up stuck ending)",
    ),
    ("link-drop-doubt", "a link drop erases the changes in doubt"),
    (
        "safe-stop-on-standby",
        "the safe stop's door does not ask whether this process owns the link (a standby answers it)",
    ),
    (
        "change-after-end",
        "a change admitted under a lease is sent after that lease ended",
    ),
    (
        "owner-gate-never-closes",
        "the link-owner gate stays open once opened (two gateways through a stalled store)",
    ),
    (
        "crash-doubt-forgotten",
        "a restart after a crash forgets what the crashed run had at the station",
    ),
    (
        "clean-stop-doubt-forgotten",
        "a clean stop does not write what is still at the station into its ledger",
    ),
    (
        "adoption-without-settle",
        "the safe state owed after a lease ended at a takeover is written before the changes in doubt inherited with it settle",
    ),
    (
        "lapse-not-recorded",
        "a doubt's lapse is not written into the station's ledger (its lock-delay lost on a clean stop, a restart or a handover before the next grant)",
    ),
];

/// Whether the hole `name` is put back in this process.
#[cfg(feature = "reintroduce-holes")]
pub fn active(name: &str) -> bool {
    PUT_BACK.get().is_some_and(|hole| hole == name)
}

/// Whether the hole `name` is put back in this process: never, without the feature.
#[cfg(not(feature = "reintroduce-holes"))]
#[inline(always)]
pub fn active(_name: &str) -> bool {
    false
}

#[cfg(feature = "reintroduce-holes")]
static PUT_BACK: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Puts the hole `name` back for the rest of the process.
pub fn reintroduce(name: &str) -> Result<(), String> {
    if !HOLES.iter().any(|(hole, _)| *hole == name) {
        let known: Vec<_> = HOLES.iter().map(|(hole, _)| *hole).collect();
        return Err(format!(
            "no hole named {name:?}; the holes are: {}",
            known.join(", ")
        ));
    }
    #[cfg(feature = "reintroduce-holes")]
    {
        let _ = PUT_BACK.set(name.to_owned());
        Ok(())
    }
    #[cfg(not(feature = "reintroduce-holes"))]
    Err("holes are put back only in a build with --features reintroduce-holes".into())
}

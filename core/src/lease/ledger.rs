//! The ledger of what one physical station is owed, as one record in the lease store keyed by
//! the station's normalised identity (from its HELLO, [`identity_key`]), not by the name of the
//! gateway or control lease that serves it: `duties:station:<identity>`. Whoever serves the
//! station next — the same gateway after a restart, a standby, a gateway of a lab that names the
//! station otherwise, another spelling of `station.id` — reads it when its link first meets the
//! station, before anything but HELLO reaches the station, and takes the duties over.
//!
//! What it keeps (pure data here; the control lease reads and writes it, `control/ledger.rs`):
//! - the control lease the duties were recorded under ([`StationDuties::lease`]);
//! - that a lease was taken and its end is not recorded yet (`end_pending`: its holder), and
//!   the safe state it leaves owed should it end unseen (`safe_state_owed`);
//! - the lock-delay in force, after whose lease and why;
//! - the changes in doubt at the station: each lease fence and how long it may still land.
//!
//! Times are kept as what is left when the record is written (each writer drops what is over),
//! and are read back whole: no clock says reliably how long ago the record was written. The
//! store's would (the record's TTL less what is left of it), but a step forward of that clock
//! would eat a lock-delay or a doubt that still runs, letting a late change land inside the
//! next lease; reading them whole costs at most one lock-delay's wait after a long stop.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::config::identity_key;

/// What the owner of a station's link does once it may serve the station that said an
/// identity, before its link sends it anything but HELLO: the control lease reads the
/// station's ledger and takes its duties over (`ControlLease::adopt_station`). `Err` says why
/// the station may not be served yet (the link asks again).
pub type Adopter = std::sync::Arc<
    dyn Fn(String) -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync,
>;

/// How long the store keeps a station's record after its last write: a station nobody serves
/// for longer than this is owed nothing any more.
pub const RECORD_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The name of the record of the station that says `identity` in its HELLO, after
/// [`identity_key`] (case and spacing do not matter).
pub fn record_name(identity: &str) -> String {
    format!("duties:station:{}", identity_key(identity))
}

/// The lock-delay a station's record keeps: after whose lease (its fence), why (a
/// `LockDelayWhy` code), and how long it has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedDelay {
    pub after: String,
    pub fence: u64,
    pub why: String,
    pub left: Duration,
}

/// A change in doubt at the station: its lease fence (0: made without a lease), and how long
/// it may still be carried out by the station's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedDoubt {
    pub fence: u64,
    pub left: Duration,
}

/// What one physical station is owed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StationDuties {
    /// The control lease these were recorded under.
    pub lease: String,
    /// A lease was taken and its end is not recorded: its holder. Should it end unseen (the
    /// gateway stopped, or another took the station over), the next holder waits the whole
    /// lock-delay.
    pub end_pending: Option<String>,
    /// A safe state is owed after this holder's lease should it end unseen, or is owed now
    /// (written before the lease is taken, cleared once the safe state read back right).
    pub safe_state_owed: Option<String>,
    /// The lock-delay in force.
    pub lock_delay: Option<RecordedDelay>,
    /// The changes in doubt at the station.
    pub doubts: Vec<RecordedDoubt>,
}

impl StationDuties {
    /// Nothing owed, under the control lease `lease`.
    pub fn none(lease: impl Into<String>) -> StationDuties {
        StationDuties {
            lease: lease.into(),
            ..StationDuties::default()
        }
    }

    /// Whether anything is owed at all (a record that owes nothing need not be kept).
    pub fn owes_anything(&self) -> bool {
        self.end_pending.is_some()
            || self.safe_state_owed.is_some()
            || self.lock_delay.is_some()
            || !self.doubts.is_empty()
    }

    /// The record as the store keeps it: the owner text of `duties:station:<identity>`.
    pub fn encode(&self) -> String {
        let text = RecordText {
            v: 1,
            lease: self.lease.clone(),
            ttl_ms: millis(RECORD_TTL),
            end_pending: self.end_pending.clone(),
            safe_state_owed: self.safe_state_owed.clone(),
            lock_delay: self.lock_delay.as_ref().map(|delay| DelayText {
                after: delay.after.clone(),
                fence: delay.fence,
                why: delay.why.clone(),
                left_ms: millis(delay.left),
            }),
            doubts: self
                .doubts
                .iter()
                .map(|doubt| DoubtText {
                    fence: doubt.fence,
                    left_ms: millis(doubt.left),
                })
                .collect(),
        };
        serde_json::to_string(&text).unwrap_or_else(|_| String::from("{}"))
    }

    /// The record the store keeps as `text`, each time in it as it was written (what the
    /// store's clock says has passed since is not taken off: a step of that clock would eat
    /// it). A record this version cannot read owes everything it might: `Err` says why, and
    /// the caller waits the whole lock-delay.
    pub fn decode(text: &str) -> Result<StationDuties, String> {
        let record: RecordText = serde_json::from_str(text)
            .map_err(|why| format!("the station's ledger record cannot be read: {why}"))?;
        let left = |ms: u64| Duration::from_millis(ms);
        Ok(StationDuties {
            lease: record.lease,
            end_pending: record.end_pending,
            safe_state_owed: record.safe_state_owed,
            lock_delay: record
                .lock_delay
                .map(|delay| RecordedDelay {
                    after: delay.after,
                    fence: delay.fence,
                    why: delay.why,
                    left: left(delay.left_ms),
                })
                .filter(|delay| !delay.left.is_zero()),
            doubts: record
                .doubts
                .into_iter()
                .map(|doubt| RecordedDoubt {
                    fence: doubt.fence,
                    left: left(doubt.left_ms),
                })
                .filter(|doubt| !doubt.left.is_zero())
                .collect(),
        })
    }
}

/// `duration` in whole milliseconds, rounded up (a time left never reads as less than it is).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RecordText {
    v: u32,
    lease: String,
    /// The TTL the record was written for; no longer read back (kept so that a gateway of an
    /// earlier version can still read the record).
    ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end_pending: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    safe_state_owed: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lock_delay: Option<DelayText>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    doubts: Vec<DoubtText>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DelayText {
    after: String,
    fence: u64,
    why: String,
    left_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DoubtText {
    fence: u64,
    left_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owing() -> StationDuties {
        StationDuties {
            lease: "control:station:st1".into(),
            end_pending: Some("TAT \"station\" 3".into()),
            safe_state_owed: Some("TAT \"station\" 3".into()),
            lock_delay: Some(RecordedDelay {
                after: "TAT \"station\" 3".into(),
                fence: 17,
                why: "changes-in-doubt".into(),
                left: Duration::from_millis(1500),
            }),
            doubts: vec![
                RecordedDoubt {
                    fence: 17,
                    left: Duration::from_millis(400),
                },
                RecordedDoubt {
                    fence: 0,
                    left: Duration::from_millis(2500),
                },
            ],
        }
    }

    #[test]
    fn a_record_reads_back_as_written_when_no_time_has_passed() {
        let duties = owing();
        assert!(duties.owes_anything());
        let read = StationDuties::decode(&duties.encode()).unwrap();
        assert_eq!(read, duties);
    }

    #[test]
    fn nothing_owed_is_nothing_and_unreadable_text_is_an_error() {
        let none = StationDuties::none("control:x");
        assert_eq!(none.lease, "control:x", "it names its control lease");
        assert!(!none.owes_anything());
        assert_eq!(StationDuties::decode(&none.encode()), Ok(none));
        assert!(StationDuties::decode("not json").is_err());
    }

    /// Each duty alone is something owed: a record that keeps only one of them is kept.
    #[test]
    fn any_one_duty_alone_is_owed() {
        let full = owing();
        let alone = [
            StationDuties {
                end_pending: full.end_pending.clone(),
                ..StationDuties::none("control:x")
            },
            StationDuties {
                safe_state_owed: full.safe_state_owed.clone(),
                ..StationDuties::none("control:x")
            },
            StationDuties {
                lock_delay: full.lock_delay.clone(),
                ..StationDuties::none("control:x")
            },
            StationDuties {
                doubts: full.doubts.clone(),
                ..StationDuties::none("control:x")
            },
        ];
        for duties in alone {
            assert!(duties.owes_anything(), "{duties:?}");
        }
    }

    #[test]
    fn a_stations_record_is_named_after_its_identity_whatever_its_case_and_spacing() {
        assert_eq!(record_name("HVS-3  ESH1"), "duties:station:hvs-3 esh1");
        assert_eq!(record_name("hvs-3 esh1 "), record_name("HVS-3 ESH1"));
    }

    /// The documented 30 days: a station nobody serves for a month is owed nothing any more.
    #[test]
    fn a_record_is_kept_thirty_days_after_its_last_write() {
        assert_eq!(RECORD_TTL, Duration::from_secs(30 * 86_400));
    }

    #[test]
    fn a_time_left_is_rounded_up_to_the_millisecond() {
        assert_eq!(millis(Duration::from_nanos(1)), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::from_millis(3)), 3);
    }
}

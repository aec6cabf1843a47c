//! How each gateway's configuration names the one physical station. In a real lab gateway A
//! may call it `bench3` at `tcp://10.0.0.5:5025` and gateway B `hv-station` at
//! `tcp://hv-station.lab:5025`: another control lease, another link-owner lease, while the
//! station (its HELLO identity, its ledger `duties:station:<identity>`, its own link-owner
//! lease `link-owner:station:<identity>`) is the same. Half the two-gateway seeds give the
//! second gateway a naming of its own, drawn from a generator of its own seeded from the seed,
//! so that the other draws of a seed (and every seed with one naming) stay as they were.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use station_core::config::{Config, HaMode};

/// A lease of a control lease named otherwise than the shared naming's: its fence N is shown
/// as this plus N in the clients' records and the trace (the audit trail says N).
pub const OTHER_LEASE_FENCES: u64 = 1_000_000;

/// How one gateway's configuration names the station.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StationNames {
    /// `station.id` (empty: unset, the control lease is named after the URL).
    pub id: String,
    /// `station.url` as written in this gateway's configuration (the simulation's link opens
    /// the same in-memory station whatever it says).
    pub url: String,
    /// `lease.name` (empty: unset).
    pub lease_name: String,
    /// Whether this gateway is configured as the other's standby (`ha.mode`). A gateway that
    /// names the station otherwise may be its own owner: only the station's own link-owner
    /// lease, named after HELLO's identity, keeps it off the station.
    pub standby: Option<bool>,
}

impl StationNames {
    /// The naming every gateway shares unless the seed says otherwise.
    pub fn shared() -> StationNames {
        StationNames {
            id: String::new(),
            url: "tcp://station.sim:4000".into(),
            lease_name: String::new(),
            standby: None,
        }
    }

    /// Puts this naming into `config`, started as a standby or not (the world decides: as
    /// configured, or a standby when another owns the link).
    pub fn apply(&self, config: &mut Config, standby: bool) {
        config.station.id = self.id.clone();
        config.station.url = self.url.clone();
        config.lease.name = self.lease_name.clone();
        if standby {
            config.ha.mode = HaMode::Standby;
        }
    }

    /// Whether gateway `index` is configured as a standby: the second is, unless its naming
    /// says otherwise.
    pub fn configured_standby(&self, index: usize) -> bool {
        self.standby.unwrap_or(index > 0)
    }

    /// What this gateway's fences are shown as, past the fence itself: 0 when its control
    /// lease is the shared naming's, [`OTHER_LEASE_FENCES`] when it is another lease (its
    /// fences count from 1 on their own, and the checks tell one lease from another by its
    /// fence).
    pub fn fence_base(&self) -> u64 {
        let control_lease = |names: &StationNames| {
            let mut config = Config::default();
            names.apply(&mut config, false);
            config.control_lease_name()
        };
        if control_lease(self) == control_lease(&StationNames::shared()) {
            0
        } else {
            OTHER_LEASE_FENCES
        }
    }

    /// What the trace says of it.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("url {}", self.url)];
        if !self.id.is_empty() {
            parts.push(format!("station.id {:?}", self.id));
        }
        if !self.lease_name.is_empty() {
            parts.push(format!("lease.name {:?}", self.lease_name));
        }
        match self.standby {
            Some(true) => parts.push("configured standby".into()),
            Some(false) => parts.push("configured owner".into()),
            None => {}
        }
        parts.join(", ")
    }
}

/// The namings of a seed's gateways, and which link-owner lease says who owns the station.
#[derive(Debug, Clone)]
pub struct Naming {
    pub gateways: Vec<StationNames>,
}

impl Naming {
    /// Draws the namings of `count` gateways for `seed`: the first always the shared one; with
    /// two, the second names the station otherwise in half the seeds.
    pub fn draw(seed: u64, count: usize) -> Naming {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6e61_6d65_735f_6473);
        let mut gateways = vec![StationNames::shared(); count];
        if count > 1 && rng.gen_bool(0.5) {
            let (id, url) = match rng.gen_range(0..3u32) {
                0 => ("hv-station", "tcp://hv-station.lab:5025"),
                1 => ("", "tcp://10.0.0.5:5025"),
                _ => ("Bench3", "tcp://bench3.lab:4000"),
            };
            gateways[1] = StationNames {
                id: id.into(),
                url: url.into(),
                lease_name: if rng.gen_bool(0.25) {
                    "hv bench".into()
                } else {
                    String::new()
                },
                standby: Some(rng.gen_bool(0.5)),
            };
        }
        Naming { gateways }
    }

    /// Whether the gateways name the station differently.
    pub fn differs(&self) -> bool {
        self.gateways.windows(2).any(|pair| pair[0] != pair[1])
    }

    /// Gateway `index`'s naming.
    pub fn of(&self, index: usize) -> StationNames {
        self.gateways
            .get(index)
            .cloned()
            .unwrap_or_else(StationNames::shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gateway_names_the_station_as_every_seed_did_and_half_the_pairs_differ() {
        assert!((1..200).all(|seed| !Naming::draw(seed, 1).differs()));
        let differing = (1..201)
            .filter(|&seed| Naming::draw(seed, 2).differs())
            .count();
        assert!((70..130).contains(&differing), "{differing} of 200 differ");
    }

    #[test]
    fn a_differing_naming_gives_the_second_gateway_another_control_lease_and_link_owner_lease() {
        let seed = (1..).find(|&seed| Naming::draw(seed, 2).differs()).unwrap();
        let naming = Naming::draw(seed, 2);
        let (mut first, mut second) = (Config::default(), Config::default());
        naming.of(0).apply(&mut first, false);
        naming.of(1).apply(&mut second, true);
        assert_ne!(first.control_lease_name(), second.control_lease_name());
        assert_ne!(first.link_owner_key(), second.link_owner_key());
    }
}

//! The one random number generator of a seed, shared by every part that draws from it.

use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;

/// The seed's generator: every choice of a run (clients, faults, the store's delays) comes
/// from it, in the order the single-threaded runtime makes them.
pub type SimRng = Arc<Mutex<StdRng>>;

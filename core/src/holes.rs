//! Test-only: holes the project has fixed, put back one by name at run time, so that the lab's
//! deterministic simulation (`station-dst --reintroduce NAME`) can show it finds them. Compiled
//! to nothing without the `reintroduce-holes` feature: [`active`] is then `false` wherever it
//! is asked, and the optimiser drops the hole's code.

/// The holes that can be put back, each with what it undoes.
pub const HOLES: &[(&str, &str)] = &[];

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

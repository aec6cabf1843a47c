//! Fuzz targets for the station gateway; the target bodies live in [`targets`].
pub mod targets;

//! The vocabulary every front end shares about the REST API itself, kept below them all.

/// The REST API version this gateway serves (`api/capabilities`, the event stream's `hello`).
pub const API_VERSION: &str = "1.0";

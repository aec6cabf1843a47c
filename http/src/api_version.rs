//! The vocabulary every front end shares about the REST API itself, kept below them all.

/// The REST API version this gateway serves (`api/capabilities`, the event stream's `hello`): a
/// JSON integer, as the .NET client binds it (`int ApiVersion` of `CapabilitiesDto` and
/// `StreamStateDto`, `WebApiClient/Models/CapabilitiesModels.cs` at 7356d81).
pub const API_VERSION: u32 = 1;

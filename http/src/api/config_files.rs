//! `api/application/config/...`: station configuration files, kept by the gateway: list,
//! what was loaded, load, save, download, upload (multipart, as the clients send it:
//! `_post_multipart` in `accordionq2/_base.py` 5.28.1, `PostMultipartAsync` in the .NET
//! client's `WebApiClient/Internal/ApiGroupBase.cs`), delete.

use hyper::Response;
use hyper::header::{CONTENT_DISPOSITION, CONTENT_TYPE, HeaderValue};
use serde_json::json;

use super::call::{Answer, Call, ok};
use super::route::AskedFrom;
use crate::config_files::format::ConfigFile;
use crate::config_files::{self, ConfigFileError, check_name};
use crate::error::ApiError;
use crate::requests::config_files::ConfigFileRequest;

/// `GET api/application/config/list`: the files' names.
pub(super) async fn list(call: Call<'_>) -> Answer {
    ok(json!(call.gateway.config_files.list().await?))
}

/// `GET api/application/config/loaded`: the files loaded since the station was last
/// (re)connected, the latest last.
pub(super) async fn loaded(call: Call<'_>) -> Answer {
    let generation = call.gateway.station.info().generation;
    ok(json!(call.gateway.config_files.loaded_in(generation)))
}

/// `POST api/application/config/load {FileName}`: applies the file under the lease.
pub(super) async fn load(call: Call<'_>, request: ConfigFileRequest) -> Answer {
    let ConfigFileRequest { file_name: name } = request;
    let (files, station) = (
        call.gateway.config_files.clone(),
        call.gateway.station.clone(),
    );
    let (admitted, origin) = (call.admitted.clone(), call.change_origin()?);
    // Its own task: a caller that hangs up does not stop the sequence halfway (nor, once its
    // steps are the station service's change, their audit line).
    let running =
        call.gateway.station.runtime().spawn(async move {
            config_files::load(&files, &station, &name, &admitted, origin).await
        });
    let report = running.await.map_err(|error| {
        ApiError::internal(format!("the load failed inside the gateway: {error}"))
    })??;
    ok(json!({
        "fileName": report.file,
        "generation": report.generation,
        "applied": report.applied,
    }))
}

/// `POST api/application/config/save {FileName}`: the station as it is now, to a file.
pub(super) async fn save(call: Call<'_>, request: ConfigFileRequest) -> Answer {
    let ConfigFileRequest { file_name: name } = request;
    let gateway = call.gateway;
    // The access rules' `save_config` over every channel the snapshot would hold.
    let every: Vec<String> = super::call::known_channels(gateway)?
        .channels
        .iter()
        .map(|c| c.name.clone())
        .collect();
    gateway
        .station
        .may(&call.who(), &every, crate::rules::Action::SaveConfig)
        .map_err(|refusal| {
            ApiError::from(crate::link::LinkError::Refused(
                crate::link::GuardRefusal::from(refusal),
            ))
        })?;
    let channels =
        config_files::save(&gateway.config_files, &gateway.station, &name, call.peer).await?;
    ok(json!({ "fileName": name, "channels": channels }))
}

/// `GET api/application/config/download/{name}`: the file's bytes.
pub(super) async fn download(call: Call<'_>) -> Answer {
    let name = percent_decoded(call.id)?;
    let bytes = call.gateway.config_files.read(&name).await?;
    let mut response = Response::new(super::super::reply::Body::whole(bytes));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/toml; charset=utf-8"),
    );
    if let Ok(disposition) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        response
            .headers_mut()
            .insert(CONTENT_DISPOSITION, disposition);
    }
    Ok(response)
}

/// `POST api/application/config/upload` (multipart/form-data, one file part): checked to be a
/// configuration file before it is kept; an existing file of that name is replaced.
pub(super) async fn upload(call: Call<'_>) -> Answer {
    let content_type = call
        .headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let (name, data) = multipart_file(content_type, &call.raw)?;
    check_name(&name)?;
    let limit = call.gateway.config_files.max_file_bytes();
    if data.len() > limit {
        return Err(ConfigFileError::TooLarge {
            size: data.len(),
            limit,
        }
        .into());
    }
    ConfigFile::parse(data).map_err(|error| {
        ApiError::bad_request(format!(
            "{name} is not a station configuration file: {error}"
        ))
    })?;
    call.gateway
        .config_files
        .write(&name, data.to_vec())
        .await?;
    ok(json!({ "fileName": name, "bytes": data.len() }))
}

/// What an upload's audit line says was asked: `file=NAME`, the file part's name (when the
/// body has one).
pub(super) fn asked_upload(request: AskedFrom<'_>) -> Option<String> {
    let content_type = request.headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let (name, _) = multipart_file(content_type, request.raw).ok()?;
    Some(format!("file={name}"))
}

/// What a delete's audit line says was asked: `file=NAME`.
pub(super) fn asked_delete(request: AskedFrom<'_>) -> Option<String> {
    percent_decoded(request.id)
        .ok()
        .map(|name| format!("file={name}"))
}

/// `DELETE api/application/config/{name}`.
pub(super) async fn delete(call: Call<'_>) -> Answer {
    let name = percent_decoded(call.id)?;
    call.gateway.config_files.delete(&name).await?;
    Ok(crate::reply::no_content())
}

/// A path segment or RFC 5987 value with `%XX` escapes undone; must be UTF-8.
fn percent_decoded(text: &str) -> Result<String, ApiError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| ApiError::bad_request(format!("bad %-escape in {text:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::bad_request(format!("{text:?} is not UTF-8 once decoded")))
}

/// The first file part of a multipart/form-data body: its file name and bytes.
fn multipart_file<'a>(content_type: &str, body: &'a [u8]) -> Result<(String, &'a [u8]), ApiError> {
    let bad = |why: &str| ApiError::bad_request(format!("the upload {why}"));
    let (kind, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(bad(
            "must be multipart/form-data with one file part (Content-Type says otherwise)",
        ));
    }
    let boundary = params
        .split(';')
        .filter_map(|param| param.trim().split_once('='))
        .find(|(key, _)| key.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, value)| value.trim().trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| bad("has no multipart boundary"))?;
    let delimiter = format!("--{boundary}");
    let mut rest = body;
    let start = find(rest, delimiter.as_bytes()).ok_or_else(|| bad("has no parts"))?;
    rest = &rest[start + delimiter.len()..];
    let closing = format!("\r\n--{boundary}");
    loop {
        if rest.starts_with(b"--") {
            return Err(bad("has no file part"));
        }
        let rest_after_line = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| bad("is malformed"))?;
        let headers_end =
            find(rest_after_line, b"\r\n\r\n").ok_or_else(|| bad("has a part without headers"))?;
        let headers = std::str::from_utf8(&rest_after_line[..headers_end])
            .map_err(|_| bad("has part headers that are not text"))?;
        let content = &rest_after_line[headers_end + 4..];
        let end = find(content, closing.as_bytes())
            .ok_or_else(|| bad("is cut short (no closing boundary)"))?;
        if let Some(name) = file_name(headers)? {
            return Ok((name, &content[..end]));
        }
        rest = &content[end + closing.len()..];
    }
}

/// The file name of a part's `Content-Disposition`: `filename*=UTF-8''...` before `filename=`.
fn file_name(headers: &str) -> Result<Option<String>, ApiError> {
    let Some(disposition) = headers.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case("content-disposition")
            .then_some(value)
    }) else {
        return Ok(None);
    };
    let params: Vec<(String, String)> = disposition
        .split(';')
        .filter_map(|param| param.trim().split_once('='))
        .map(|(key, value)| (key.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    if let Some((_, value)) = params.iter().find(|(key, _)| key == "filename*") {
        let encoded = value
            .split_once("''")
            .map(|(_, encoded)| encoded)
            .unwrap_or(value);
        return percent_decoded(encoded).map(Some);
    }
    Ok(params
        .iter()
        .find(|(key, _)| key == "filename")
        .map(|(_, value)| value.trim_matches('"').to_owned()))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python_upload(name: &str, data: &[u8]) -> (String, Vec<u8>) {
        let boundary = "0123abcd";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename*=UTF-8''{name}\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        (format!("multipart/form-data; boundary={boundary}"), body)
    }

    #[test]
    fn the_file_part_of_a_client_upload_is_found() {
        let (content_type, body) = python_upload("HV%20setup.cfg", b"format_version = 1\r\n");
        let (name, data) = multipart_file(&content_type, &body).unwrap();
        assert_eq!(name, "HV setup.cfg");
        assert_eq!(data, b"format_version = 1\r\n");
        // The .NET client's shape: a quoted boundary, a plain filename, another part first.
        let dotnet = b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nignored\r\n--b\r\nContent-Disposition: form-data; name=file; filename=a.cfg\r\n\r\nDATA\r\n--b--\r\n";
        let (name, data) = multipart_file("multipart/form-data; boundary=\"b\"", dotnet).unwrap();
        assert_eq!((name.as_str(), data), ("a.cfg", &b"DATA"[..]));
    }

    #[test]
    fn a_body_that_is_no_upload_is_refused_saying_why() {
        let (content_type, body) = python_upload("a.cfg", b"x");
        for (content_type, body, why) in [
            ("application/json", &body[..], "multipart/form-data"),
            ("multipart/form-data", &body[..], "boundary"),
            (content_type.as_str(), &body[..body.len() - 12], "cut short"),
            (
                content_type.as_str(),
                &b"--0123abcd--\r\n"[..],
                "no file part",
            ),
        ] {
            let error = multipart_file(content_type, body).unwrap_err();
            assert_eq!(error.kind, crate::error::ErrorKind::BadRequest);
            assert!(error.message.contains(why), "{error:?}");
        }
    }

    #[test]
    fn escapes_are_undone_and_bad_ones_refused() {
        assert_eq!(percent_decoded("a%2Fb%20c").unwrap(), "a/b c");
        assert!(percent_decoded("a%2").is_err());
        assert!(percent_decoded("%ff").is_err());
    }
}

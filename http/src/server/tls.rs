//! HTTPS with rustls: the certificate chain and private key named by `[http.tls]`, read at
//! start-up into a [`TlsAcceptor`] that the accept loop wraps every connection in.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// Why HTTPS could not be set up; every message names the config key at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("config key {key}: cannot read {path:?}: {message}")]
    Read {
        key: &'static str,
        path: String,
        message: String,
    },
    #[error("config key {key}: {path:?} holds no {what} in PEM form")]
    Empty {
        key: &'static str,
        path: String,
        what: &'static str,
    },
    #[error(
        "config keys http.tls.cert and http.tls.key: the certificate and key cannot be used together: {0}"
    )]
    Rejected(String),
}

/// The acceptor for `config`, or `None` while TLS is off.
pub fn acceptor(config: &TlsConfig) -> Result<Option<TlsAcceptor>, TlsError> {
    if !config.enabled() {
        return Ok(None);
    }
    let read = |key: &'static str, path: &str| {
        std::fs::read(path).map_err(|error| TlsError::Read {
            key,
            path: path.to_owned(),
            message: error.to_string(),
        })
    };
    let cert_pem = read("http.tls.cert", &config.cert)?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Read {
            key: "http.tls.cert",
            path: config.cert.clone(),
            message: error.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            key: "http.tls.cert",
            path: config.cert.clone(),
            what: "certificate",
        });
    }
    let key_pem = read("http.tls.key", &config.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| match error {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            key: "http.tls.key",
            path: config.key.clone(),
            what: "private key",
        },
        other => TlsError::Read {
            key: "http.tls.key",
            path: config.key.clone(),
            message: other.to_string(),
        },
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Rejected(error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|error| TlsError::Rejected(error.to_string()))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_while_not_configured() {
        assert!(acceptor(&TlsConfig::default()).unwrap().is_none());
    }

    #[test]
    fn a_missing_file_is_named_with_its_key() {
        let config = TlsConfig {
            cert: "/nonexistent/gateway.crt".into(),
            key: "/nonexistent/gateway.key".into(),
        };
        let message = acceptor(&config).err().unwrap().to_string();
        assert!(message.contains("http.tls.cert"), "{message}");
        assert!(message.contains("/nonexistent/gateway.crt"), "{message}");

        let dir = std::env::temp_dir().join(format!("sg-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("not-a-cert.pem");
        std::fs::write(&cert, "hello\n").unwrap();
        let config = TlsConfig {
            cert: cert.display().to_string(),
            key: "/nonexistent/gateway.key".into(),
        };
        let message = acceptor(&config).err().unwrap().to_string();
        assert!(message.contains("http.tls.cert"), "{message}");
        assert!(message.contains("no certificate"), "{message}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

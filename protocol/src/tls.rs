//! TLS for the exchange's ports, from PEM files (rustls with the ring
//! provider; TLS 1.2 and 1.3): the identity a listener presents, and the
//! trust a connecting side checks it against. The client port (`wss://`),
//! a gateway's link and a cluster's Raft port all load theirs here
//! (docs/operations.md "Ports and secrets").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Why a TLS file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("the certificate and key do not form a usable TLS identity: {0}")]
    Identity(String),
    #[error("{path}: a trusted certificate rustls refuses: {reason}")]
    Trust { path: PathBuf, reason: String },
    #[error("{0:?} is not a host name or IP address to check a certificate against")]
    ServerName(String),
    /// The private key's file (others may read it, or it is missing).
    #[error("the TLS key: {0}")]
    Key(#[from] crate::secret_file::SecretFileError),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |reason: String| TlsError::Read { path: path.to_path_buf(), reason };
    let certificates: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(path).and_then(|all| all.collect()).map_err(|e| read(e.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certificates)
}

/// A listener's identity: its certificate chain and private key (a secret
/// file: refused when others may read it, `crate::secret_file`).
pub fn server_config(cert_path: &Path, key_path: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certificates = certificates(cert_path)?;
    let pem = crate::secret_file::read(key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Read { path: key_path.to_path_buf(), reason: e.to_string() })?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Identity(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certificates, key)
        .map_err(|e| TlsError::Identity(e.to_string()))?;
    Ok(Arc::new(config))
}

/// What a connecting side trusts: the certificates (a private CA, or the
/// listener's own self-signed one) in `ca_path`.
pub fn client_config(ca_path: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates(ca_path)? {
        roots.add(certificate).map_err(|e| TlsError::Trust { path: ca_path.to_path_buf(), reason: e.to_string() })?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Identity(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name a listener's certificate must carry, from the `host:port` it
/// is reached at (a DNS name or an IP address).
pub fn server_name(address: &str) -> Result<ServerName<'static>, TlsError> {
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => address,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::ServerName(address.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_addresses_and_missing_files_say_which() {
        assert!(matches!(server_name("10.0.0.5:7400"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(server_name("[::1]:7400"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(server_name("node1.internal:7400"), Ok(ServerName::DnsName(_))));
        assert!(matches!(server_name("bad name:1"), Err(TlsError::ServerName(_))));
        let missing = Path::new("/nonexistent/ca.pem");
        assert!(matches!(client_config(missing), Err(TlsError::Read { path, .. }) if path == missing));
        let dir = std::env::temp_dir().join(format!("gpux-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").expect("writes");
        assert!(matches!(client_config(&empty), Err(TlsError::NoCertificate(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

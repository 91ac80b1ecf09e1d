//! Certificates for private TLS servers, generated per test with `rcgen`: a certificate
//! authority, a server certificate it signs for `localhost` and `127.0.0.1`, a client
//! certificate for servers that ask for one, and a second authority that signed none of them
//! (for a test that a client trusting the wrong one fails).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// PEM files in one folder: `ca.pem`, `server.pem` with `server.key`, `client.pem` with
/// `client.key`, and `other-ca.pem`. The keys are PKCS#8, readable by the server only when the
/// folder's owner runs it (see [`Certs::chown`]).
#[derive(Clone, Debug)]
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Generates a new authority and certificates into `dir` (created if missing).
    pub fn generate(dir: &Path) -> Certs {
        std::fs::create_dir_all(dir).unwrap();
        let (ca_pem, ca) = authority("idem test CA");
        let (other_pem, _) = authority("idem test CA (not the server's)");
        let names = vec!["localhost".to_string()];
        let (server_pem, server_key) = leaf(&ca, names, ExtendedKeyUsagePurpose::ServerAuth);
        let (client_pem, client_key) = leaf(&ca, vec![], ExtendedKeyUsagePurpose::ClientAuth);
        let files = [
            ("ca.pem", ca_pem),
            ("other-ca.pem", other_pem),
            ("server.pem", server_pem),
            ("server.key", server_key),
            ("client.pem", client_pem),
            ("client.key", client_key),
        ];
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let certs = Certs {
            dir: dir.to_path_buf(),
        };
        set_mode(&certs.server_key(), 0o600);
        set_mode(&certs.client_key(), 0o600);
        certs
    }

    /// The authority that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// An authority that signed neither.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    /// The server's certificate, for `localhost` and `127.0.0.1`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    /// The server's private key (mode 0600).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A client certificate (common name `idem`), for servers that verify clients.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    /// The client's private key (mode 0600).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// Gives the folder and its files to `user` (a server that runs as another user, as
    /// PostgreSQL under root, must own its key).
    pub fn chown(&self, user: &str) {
        let status = std::process::Command::new("chown")
            .args(["-R", &format!("{user}:{user}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success(), "chown of {}", self.dir.display());
    }
}

/// A self-signed authority: its PEM and the issuer that signs with it.
fn authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}

/// A certificate `ca` signs for `names` (and `127.0.0.1` when any): its PEM and key's PEM.
fn leaf(
    ca: &Issuer<'static, KeyPair>,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let server = !names.is_empty();
    let mut params = CertificateParams::new(names).unwrap();
    if server {
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    params.distinguished_name.push(DnType::CommonName, "idem");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_pem_and_the_keys_private() {
        let dir = std::env::temp_dir().join(crate::backends::unique_name("certs"));
        let certs = Certs::generate(&dir);
        for path in [
            certs.ca(),
            certs.other_ca(),
            certs.server_cert(),
            certs.client_cert(),
        ] {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{path:?}");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(certs.server_key())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_ne!(
            std::fs::read(certs.ca()).unwrap(),
            std::fs::read(certs.other_ca()).unwrap()
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}

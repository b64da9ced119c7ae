//! `locus tls-credentials`: X.509 credentials for `locus serve --tls-certificates`, made
//! in-process — a CA, a server certificate and a client certificate it signs, in PEM files
//! named as qemu, nbdkit and libnbd expect them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Make TLS credentials for `locus serve --tls-certificates` and its clients.
///
/// Writes DIR/server (ca-cert.pem, server-cert.pem, server-key.pem: give it to
/// `locus serve --tls-certificates DIR/server`) and DIR/client (ca-cert.pem, client-cert.pem,
/// client-key.pem: for libnbd's `nbds://HOST?tls-certificates=DIR/client` or qemu's
/// `--object tls-creds-x509,dir=DIR/client,endpoint=client`; the client certificate is what
/// `--tls-verify-peer` asks for). A fresh CA signs both; its private key is never written, so
/// nothing else can be signed with it — make new credentials to add clients. Private keys are
/// written with mode 0600; existing files are never replaced.
#[derive(Debug, Args)]
pub struct CredentialsArgs {
    /// Directory to create the two credential directories in.
    dir: PathBuf,

    /// A name clients use to reach the server (repeatable): a DNS name or an IP address. The
    /// client checks it against the URI's host. Default: localhost and 127.0.0.1 and ::1.
    #[arg(long = "name", value_name = "HOST")]
    names: Vec<String>,

    /// Days the certificates are valid.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
}

pub fn run(args: &CredentialsArgs) -> Result<()> {
    let names = if args.names.is_empty() {
        vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ]
    } else {
        args.names.clone()
    };
    for name in &names {
        if name.is_empty()
            || name.contains(['/', ' ', ':']) && name.parse::<std::net::IpAddr>().is_err()
        {
            bail!("--name {name:?}: a DNS name or an IP address");
        }
    }
    make(&args.dir, &names, args.days)?;
    eprintln!(
        "locus: wrote {dir}/server for `locus serve --tls-certificates {dir}/server` and \
         {dir}/client for clients (nbds://{host}?tls-certificates={dir}/client); valid {days} \
         days for {}",
        names.join(", "),
        dir = args.dir.display(),
        host = names[0],
        days = args.days
    );
    Ok(())
}

/// Writes `server/{ca-cert,server-cert,server-key}.pem` and
/// `client/{ca-cert,client-cert,client-key}.pem` under `dir`: a fresh CA (its key is not
/// kept, so nothing more can be signed with it), a server certificate for `names`, and a
/// client certificate named `client` for `--tls-verify-peer`. Private keys are written 0600.
pub fn make(dir: &Path, names: &[String], days: u32) -> Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let until = now + time::Duration::days(i64::from(days));
    let ca_key = KeyPair::generate().context("generating the CA's key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "locus serve CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (ca.not_before, ca.not_after) = (now, until);
    let ca_cert = ca.self_signed(&ca_key).context("signing the CA")?;
    let issuer = Issuer::from_params(&ca, &ca_key);

    let leaf = |names: Vec<String>, common: &str, purpose| -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)
            .with_context(|| format!("certificate names for {common}"))?;
        params.distinguished_name.push(DnType::CommonName, common);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![purpose];
        (params.not_before, params.not_after) = (now, until);
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let common = names.first().map_or("locus", String::as_str);
    let (server_cert, server_key) =
        leaf(names.to_vec(), common, ExtendedKeyUsagePurpose::ServerAuth)?;
    let (client_cert, client_key) =
        leaf(Vec::new(), "client", ExtendedKeyUsagePurpose::ClientAuth)?;
    for (sub, files) in [
        (
            "server",
            [
                ("ca-cert.pem", ca_cert.pem(), false),
                ("server-cert.pem", server_cert, false),
                ("server-key.pem", server_key, true),
            ],
        ),
        (
            "client",
            [
                ("ca-cert.pem", ca_cert.pem(), false),
                ("client-cert.pem", client_cert, false),
                ("client-key.pem", client_key, true),
            ],
        ),
    ] {
        let sub = dir.join(sub);
        std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        for (name, pem, secret) in files {
            write(&sub.join(name), &pem, secret)?;
        }
    }
    Ok(())
}

fn write(path: &Path, text: &str, secret: bool) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (an existing file is never replaced)",
                path.display()
            )
        })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

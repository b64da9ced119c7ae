//! `locus tls-credentials`: X.509 credentials for `locus serve --tls-certificates`, made
//! in-process — a CA, a server certificate and a client certificate it signs, in PEM files
//! named as qemu, nbdkit and libnbd expect them. `locus tls-psk`: identities with fresh keys
//! in a pre-shared key file for `locus serve --tls-psk`.

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

/// Add identities with fresh random keys to a pre-shared key file for `locus serve --tls-psk`.
///
/// Each identity gets 32 random bytes from the kernel, written as an `identity:hexkey` line
/// (the form GnuTLS's `psktool` writes, and qemu and libnbd read). A missing FILE is created
/// with mode 0600; an existing one must parse, and gets the new lines at its end. An identity
/// the file already has is refused, never given a new key (remove its line first). A client
/// needs its own line: libnbd as `nbds://NAME@HOST?tls-psk-file=FILE`, qemu as
/// `--object tls-creds-psk,id=tls0,dir=DIR,username=NAME,endpoint=client` with the line in
/// DIR/keys.psk.
#[derive(Debug, Args)]
pub struct PskArgs {
    /// The key file (created if missing).
    file: PathBuf,

    /// An identity (a user name) to add (repeatable): no colon, no white space.
    #[arg(long = "identity", value_name = "NAME", required = true)]
    identities: Vec<String>,
}

/// Bytes of a key `locus tls-psk` makes (what `psktool` makes by default).
const PSK_KEY_BYTES: usize = 32;

pub fn run_psk(args: &PskArgs) -> Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;

    for (i, name) in args.identities.iter().enumerate() {
        if name.is_empty() || name.contains(':') || name.chars().any(char::is_whitespace) {
            bail!("--identity {name:?}: a name without colons or white space");
        }
        if args.identities[..i].contains(name) {
            bail!("--identity {name:?} is given twice");
        }
    }
    let existing = match std::fs::read_to_string(&args.file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", args.file.display())),
    };
    if let Some(text) = &existing {
        let keys = nbd::server::parse_psk_file(&args.file, text)?;
        for name in &args.identities {
            if keys.contains_key(name.as_bytes()) {
                bail!(
                    "{} already has a key for {name:?}; keys are never replaced (remove its \
                     line to make a new one)",
                    args.file.display()
                );
            }
        }
    }
    let mut random = std::fs::File::open("/dev/urandom").context("opening /dev/urandom")?;
    let mut lines = String::new();
    if existing
        .as_ref()
        .is_some_and(|t| !t.is_empty() && !t.ends_with('\n'))
    {
        lines.push('\n');
    }
    for name in &args.identities {
        let mut key = [0u8; PSK_KEY_BYTES];
        random
            .read_exact(&mut key)
            .context("reading /dev/urandom")?;
        lines.push_str(&format!("{name}:{}\n", volume::hex(&key)));
    }
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create_new(existing.is_none())
        .mode(0o600)
        .open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))?;
    file.write_all(lines.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", args.file.display()))?;
    let names = args.identities.join(", ");
    eprintln!(
        "locus: {} {names} to {file}; serve with `locus serve --tls-psk {file}`; a client \
         needs its line (libnbd: nbds://{first}@HOST?tls-psk-file=FILE; qemu: tls-creds-psk \
         with the line in DIR/keys.psk)",
        if existing.is_some() { "added" } else { "wrote" },
        file = args.file.display(),
        first = args.identities[0],
    );
    Ok(())
}

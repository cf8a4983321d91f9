//! `kubectl kedge dev-certs`: a CA, a hub server certificate and member client certificates
//! for development and tests. Production enrollment issues member certificates from CSRs.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{Error, Result};

/// Bounds of `--validity`: shorter certificates expire during a test run, longer ones are
/// beyond what any CA should sign.
pub const VALIDITY: (Duration, Duration) = (
    Duration::from_secs(3600),
    Duration::from_secs(3650 * 24 * 3600),
);

/// Arguments of `dev-certs`.
#[derive(Debug, Clone, Args)]
pub struct DevCertsArgs {
    /// Directory to write into; an existing CA there is reused.
    #[arg(long)]
    pub dir: PathBuf,
    /// DNS names and IP addresses the hub certificate is valid for.
    #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1,::1")]
    pub hub_names: Vec<String>,
    /// Members to issue client certificates for.
    #[arg(long, value_delimiter = ',')]
    pub members: Vec<String>,
    /// Lifetime of the hub and member certificates (1h to 3650days).
    #[arg(long, default_value = "30days", value_parser = kedge_net::flags::duration_within(VALIDITY.0, VALIDITY.1))]
    pub validity: Duration,
}

/// Writes the files and prints their paths.
pub fn run(args: &DevCertsArgs, out: &mut impl std::io::Write) -> Result<()> {
    let lifetime = time::Duration::try_from(args.validity)
        .map_err(|_| Error::Argument(format!("--validity {:?} is too long", args.validity)))?;
    let paths = kedge_net::pki::write_dev_pki(&args.dir, &args.hub_names, &args.members, lifetime)?;
    writeln!(out, "ca:      {}", paths.ca_cert().display())?;
    writeln!(
        out,
        "hub:     {} {}",
        paths.hub_cert().display(),
        paths.hub_key().display()
    )?;
    for member in &args.members {
        writeln!(
            out,
            "member {member}: {} {}",
            paths.member_cert(member).display(),
            paths.member_key(member).display()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::Cli;

    #[test]
    fn validity_out_of_range_is_refused() {
        let parse = |validity: &str| {
            Cli::try_parse_from([
                "kubectl-kedge",
                "dev-certs",
                "--dir",
                "d",
                "--validity",
                validity,
            ])
        };
        assert!(parse("1h").is_ok());
        assert!(parse("3650days").is_ok());
        for bad in ["0s", "59m", "3651days", "1000000years", "5124095576030431h"] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(
                error.contains("--validity") && error.contains("must be between 1h and 3650days"),
                "{bad}: {error}"
            );
        }
    }
}

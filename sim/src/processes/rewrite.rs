//! How a host process stands in for a container: a mount path it cannot see becomes its
//! host directory, a listener on every address becomes one on the pod's IP. Pure.

use std::path::PathBuf;

/// How a host process stands in for a container: mount paths it cannot see become their
/// host directories, listeners on every address become listeners on the pod's IP.
#[derive(Debug, Clone)]
pub(crate) struct Rewrite {
    /// (mountPath, host directory), longest mountPath first.
    mounts: Vec<(String, PathBuf)>,
    pod_ip: String,
}

impl Rewrite {
    /// The rewrite for one container's mounts and the pod's IP.
    pub(crate) fn new(mut mounts: Vec<(String, PathBuf)>, pod_ip: &str) -> Rewrite {
        for (m, _) in &mut mounts {
            while m.len() > 1 && m.ends_with('/') {
                m.pop();
            }
        }
        mounts.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
        Rewrite {
            mounts,
            pod_ip: pod_ip.to_string(),
        }
    }

    /// An arg or env value with its mount path (at its start, or after the `=` of
    /// `--flag=PATH`) and its `0.0.0.0:`/`[::]:` listeners rewritten.
    pub(crate) fn apply(&self, value: &str) -> String {
        let pathed = match value.split_once('=') {
            Some((flag, path)) if flag.starts_with('-') => {
                self.path(path).map(|p| format!("{flag}={p}"))
            }
            _ => None,
        };
        let pathed = pathed
            .or_else(|| self.path(value))
            .unwrap_or_else(|| value.to_string());
        self.listeners(&pathed)
    }

    fn path(&self, value: &str) -> Option<String> {
        self.mounts.iter().find_map(|(mount, host)| {
            let rest = value.strip_prefix(mount.as_str())?;
            let host = host.display().to_string();
            if rest.is_empty() {
                Some(host)
            } else if rest.starts_with('/') || mount == "/" {
                let rest = rest.trim_start_matches('/');
                Some(format!("{}/{rest}", host.trim_end_matches('/')))
            } else {
                None
            }
        })
    }

    fn listeners(&self, value: &str) -> String {
        let mut out = String::with_capacity(value.len());
        let mut i = 0;
        let bytes = value.as_bytes();
        while i < value.len() {
            let rest = &value[i..];
            let boundary = i == 0 || !matches!(bytes[i - 1], b'0'..=b'9' | b'.' | b':');
            let any = ["0.0.0.0:", "[::]:"]
                .into_iter()
                .find(|p| rest.starts_with(p));
            match any {
                Some(p)
                    if boundary && rest[p.len()..].starts_with(|c: char| c.is_ascii_digit()) =>
                {
                    out.push_str(&self.pod_ip);
                    out.push(':');
                    i += p.len();
                }
                _ => {
                    let c = rest.chars().next().unwrap_or_default();
                    out.push(c);
                    i += c.len_utf8();
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::Rewrite;

    #[test]
    fn mount_paths_and_listeners_are_rewritten() {
        let rw = Rewrite::new(
            vec![
                ("/etc/kedge/".into(), PathBuf::from("/tmp/p/volumes/creds")),
                (
                    "/etc/kedge/extra".into(),
                    PathBuf::from("/tmp/p/volumes/extra"),
                ),
            ],
            "127.1.2.3",
        );
        for (input, want) in [
            ("/etc/kedge/ca.crt", "/tmp/p/volumes/creds/ca.crt"),
            ("/etc/kedge", "/tmp/p/volumes/creds"),
            ("/etc/kedge/extra/x", "/tmp/p/volumes/extra/x"),
            (
                "--tls-ca=/etc/kedge/ca.crt",
                "--tls-ca=/tmp/p/volumes/creds/ca.crt",
            ),
            ("/etc/kedgex", "/etc/kedgex"),
            ("cat /etc/kedge/ca.crt", "cat /etc/kedge/ca.crt"),
            ("0.0.0.0:8080", "127.1.2.3:8080"),
            ("[::]:9090", "127.1.2.3:9090"),
            ("--listen=0.0.0.0:7443", "--listen=127.1.2.3:7443"),
            ("10.0.0.0:80", "10.0.0.0:80"),
            ("0.0.0.0:http", "0.0.0.0:http"),
            ("127.0.0.1:80", "127.0.0.1:80"),
        ] {
            assert_eq!(rw.apply(input), want, "{input}");
        }
    }
}

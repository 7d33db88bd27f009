//! Which job an endpoint belongs to, and how its traffic is protected
//! (`rdm/PROTOCOL.md` §2.5): the endpoint's `auth_key` (up to 8 bytes, a job
//! key carried in clear; 16 to 1024 bytes, a job secret), else a secret the
//! launcher hands every rank (`FI_RDMX_JOB_SECRET`, or a file named by
//! `FI_RDMX_JOB_SECRET_FILE`), else `FI_RDMX_JOB_KEY` in clear. With a
//! secret, datagrams over a wire are sealed (tagged; enciphered too with
//! `FI_RDMX_JOB_ENCRYPT=1`). The secret's bytes are never logged.
use crate::error::{Error, Result};
use rdm::engine::{JobAuth, JobSecret};
use std::sync::Arc;

/// A job secret's bytes, as given (kept for `fi_getinfo`'s answer, which
/// echoes the `auth_key`); `Debug` shows their length only.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretBytes(pub Arc<[u8]>);

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes({} bytes)", self.0.len())
    }
}

/// An `auth_key` as rdmx takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthKey {
    /// Up to 8 bytes: the job key (little-endian, zero-padded) and its length.
    JobKey(u64, usize),
    /// 16 to 1024 bytes: the job secret.
    Secret(SecretBytes),
}

impl AuthKey {
    /// Reads an `auth_key` of `len` bytes: `Ok(None)` for none, an error
    /// for a length rdmx does not take (9 to 15 bytes: too long for a key in
    /// clear, too short for a secret; more than 1024).
    pub fn from_bytes(key: &[u8]) -> Result<Option<AuthKey>> {
        match key.len() {
            0 => Ok(None),
            1..=8 => {
                let mut b = [0u8; 8];
                b[..key.len()].copy_from_slice(key);
                Ok(Some(AuthKey::JobKey(u64::from_le_bytes(b), key.len())))
            }
            n if (rdm::engine::seal::SECRET_MIN_LEN..=rdm::engine::seal::SECRET_MAX_LEN).contains(&n) => {
                Ok(Some(AuthKey::Secret(SecretBytes(key.into()))))
            }
            _ => Err(Error::NoData),
        }
    }

    /// The bytes given (what `fi_getinfo` echoes).
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            AuthKey::JobKey(k, len) => k.to_le_bytes()[..*len].to_vec(),
            AuthKey::Secret(s) => s.0.to_vec(),
        }
    }
}

/// How an endpoint's traffic over a wire goes (the stats and the logs say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// The job key in clear, a CRC-32 against corruption only.
    Clear,
    /// Every datagram tagged with the job's secret.
    Tagged,
    /// Tagged, and payloads enciphered.
    Encrypted,
}

impl Protection {
    pub fn name(self) -> &'static str {
        match self {
            Protection::Clear => "clear",
            Protection::Tagged => "tagged",
            Protection::Encrypted => "encrypted",
        }
    }
}

/// An endpoint's job: the key its packets carry, and the secret sealing
/// them when it has one.
#[derive(Clone, Debug)]
pub struct Job {
    pub key: u64,
    pub auth: Option<Arc<JobAuth>>,
}

impl Job {
    pub fn protection(&self) -> Protection {
        match &self.auth {
            None => Protection::Clear,
            Some(a) if a.encrypt => Protection::Encrypted,
            Some(_) => Protection::Tagged,
        }
    }
}

/// The job of an endpoint whose `auth_key` is `auth_key`, given the
/// environment's secret (`FI_RDMX_JOB_SECRET_FILE` / `FI_RDMX_JOB_SECRET`,
/// [`secret_from_env`]), `FI_RDMX_JOB_KEY` and `FI_RDMX_JOB_ENCRYPT`. An
/// error when a secret was asked for and cannot be had (an unreadable or
/// too short secret file): the endpoint must not fall back to traffic in
/// clear.
pub fn job_of(
    auth_key: Option<&AuthKey>,
    env_secret: Option<&std::result::Result<SecretBytes, String>>,
    job_key: u64,
    encrypt: bool,
) -> Result<Job> {
    let secret = match auth_key {
        // The operator asked for sealed traffic; an application's key in
        // clear must not quietly turn it off.
        Some(AuthKey::JobKey(..)) if env_secret.is_some() => {
            return Err(Error::Other(
                "an auth_key of up to 8 bytes (a job key in clear) beside a job secret in the environment".into(),
            ))
        }
        Some(AuthKey::JobKey(k, _)) => return Ok(Job { key: *k, auth: None }),
        Some(AuthKey::Secret(s)) => s.0.clone(),
        None => match env_secret {
            None => return Ok(Job { key: job_key, auth: None }),
            Some(Ok(s)) => s.0.clone(),
            Some(Err(why)) => return Err(Error::Other(why.clone())),
        },
    };
    let secret = JobSecret::new(&secret).map_err(|_| Error::NoData)?;
    let key = secret.job_id();
    Ok(Job { key, auth: Some(Arc::new(JobAuth { secret, encrypt })) })
}

/// How job traffic over a wire goes for an endpoint whose `auth_key` is not
/// a key (one line, for the log at `fi_getinfo`): from the environment.
pub fn environment_mode(
    env_secret: Option<&std::result::Result<SecretBytes, String>>,
    job_key: u64,
    encrypt: bool,
) -> String {
    let what = match env_secret {
        None => format!("clear: the job key {job_key:#x} in every packet, no tag (no job secret)"),
        Some(Ok(s)) if encrypt => {
            format!("encrypted: AES-128-GCM tag and enciphered payloads (a job secret of {} bytes)", s.0.len())
        }
        Some(Ok(s)) => format!("tagged: an AES-128-GCM tag on every datagram (a job secret of {} bytes)", s.0.len()),
        Some(Err(why)) => format!("none: endpoints fail to open ({why})"),
    };
    format!("job traffic over a wire, for endpoints without an auth_key of their own: {what}")
}

/// The key a job's datagrams carry: a key in clear as it is, a secret's
/// job id (what a registration of an `FI_AV_AUTH_KEY` domain names).
pub fn job_key_of(k: &AuthKey) -> Result<u64> {
    match k {
        AuthKey::JobKey(k, _) => Ok(*k),
        AuthKey::Secret(s) => Ok(JobSecret::new(&s.0).map_err(|_| Error::NoData)?.job_id()),
    }
}

/// The secret the environment names: `FI_RDMX_JOB_SECRET_FILE` (a file's
/// bytes, one trailing newline dropped) wins over `FI_RDMX_JOB_SECRET` (the
/// value's bytes). `None` when neither is set; an error text when the one
/// set cannot be used.
pub fn secret_from_env(
    value: Option<String>,
    file: Option<String>,
) -> Option<std::result::Result<SecretBytes, String>> {
    let bytes = match (file, value) {
        (Some(path), _) => match std::fs::read(&path) {
            Ok(mut b) => {
                if b.last() == Some(&b'\n') {
                    b.pop();
                }
                b
            }
            Err(e) => return Some(Err(format!("FI_RDMX_JOB_SECRET_FILE {path}: {e}"))),
        },
        (None, Some(v)) => v.into_bytes(),
        (None, None) => return None,
    };
    let (min, max) = (rdm::engine::seal::SECRET_MIN_LEN, rdm::engine::seal::SECRET_MAX_LEN);
    if !(min..=max).contains(&bytes.len()) {
        return Some(Err(format!("the job secret has {} bytes; it needs {min} to {max}", bytes.len())));
    }
    Some(Ok(SecretBytes(bytes.into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_keys_are_keys_in_clear_or_secrets_by_length() {
        assert_eq!(AuthKey::from_bytes(&[]).unwrap(), None);
        assert_eq!(AuthKey::from_bytes(&[1, 2]).unwrap(), Some(AuthKey::JobKey(0x0201, 2)));
        for bad in [9, 15, 1025] {
            assert!(AuthKey::from_bytes(&vec![1; bad]).is_err(), "{bad} bytes");
        }
        let s = AuthKey::from_bytes(&[3; 16]).unwrap().unwrap();
        assert_eq!(s.bytes(), vec![3; 16]);
        assert!(!format!("{s:?}").contains("3, 3"), "a secret's bytes in Debug: {s:?}");
    }

    #[test]
    fn an_auth_key_wins_and_a_secret_that_cannot_be_had_fails() {
        let env = secret_from_env(Some("e".repeat(16)), None);
        let clear = job_of(Some(&AuthKey::JobKey(9, 1)), None, 5, false).unwrap();
        assert_eq!((clear.key, clear.auth.is_none()), (9, true));
        assert!(
            job_of(Some(&AuthKey::JobKey(9, 1)), env.as_ref(), 5, false).is_err(),
            "a key in clear beside a secret"
        );
        let sealed = job_of(None, env.as_ref(), 5, true).unwrap();
        assert!(sealed.auth.is_some() && sealed.protection() == Protection::Encrypted);
        assert_eq!(sealed.key, JobSecret::new(&[b'e'; 16]).unwrap().job_id());
        assert_eq!(job_of(None, None, 5, false).unwrap().protection(), Protection::Clear);
        let broken = Some(Err("FI_RDMX_JOB_SECRET_FILE x: not found".to_string()));
        assert!(job_of(None, broken.as_ref(), 5, false).is_err(), "a broken secret falls back to clear");
    }

    #[test]
    fn the_environment_secret_comes_from_a_file_or_the_value_and_is_checked() {
        assert!(secret_from_env(None, None).is_none());
        assert_eq!(secret_from_env(Some("x".repeat(16)), None), Some(Ok(SecretBytes(b"xxxxxxxxxxxxxxxx"[..].into()))));
        assert!(secret_from_env(Some("short".into()), None).unwrap().is_err());
        let dir = std::env::temp_dir().join(format!("rdmx-secret-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789abcdef\n").unwrap();
        let got = secret_from_env(Some("ignored value, the file wins".into()), Some(dir.display().to_string()));
        assert_eq!(got, Some(Ok(SecretBytes(b"0123456789abcdef"[..].into()))));
        std::fs::remove_file(&dir).unwrap();
        let missing = secret_from_env(None, Some(dir.display().to_string())).unwrap();
        assert!(missing.unwrap_err().contains("FI_RDMX_JOB_SECRET_FILE"));
    }

    #[test]
    fn the_environment_mode_line_names_the_mode_and_never_the_secret() {
        let secret = "s3cr3t-s3cr3t-s3cr3t";
        let env = secret_from_env(Some(secret.into()), None);
        assert!(environment_mode(None, 7, false).contains("clear: the job key 0x7"));
        let tagged = environment_mode(env.as_ref(), 7, false);
        assert!(tagged.contains("tagged:") && tagged.contains("20 bytes"), "{tagged}");
        assert!(environment_mode(env.as_ref(), 7, true).contains("encrypted:"));
        let bad = secret_from_env(Some("short".into()), None);
        assert!(environment_mode(bad.as_ref(), 7, false).contains("none: endpoints fail to open"));
        for line in [tagged, environment_mode(env.as_ref(), 7, true)] {
            assert!(!line.contains(secret), "{line}");
        }
    }
}

//! Lease delivery on the wire: the renter's workload, its sealed secret
//! part, and the delivery status a host reports back.
//!
//! A workload has a public part (image, ports, shared memory, restart
//! policy) that the exchange validates and relays, and a secret part
//! (command, arguments, environment, SSH keys) that only the host running
//! the workload can read: the renter's client seals it to the host's X25519
//! encryption key (a libsodium-compatible sealed box, `crypto_box`), and the
//! exchange, its journal, snapshots and audit only ever hold the ciphertext.
//! The host publishes its encryption key signed by its identity (ed25519)
//! key, so a renter can check that the exchange handed over the host's own
//! key. docs/protocol.md "Lease delivery" is the reference.

use crypto_box::aead::OsRng;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

/// Bounds on a workload; each breach is its own error code.
pub mod limits {
    /// Bytes in an image reference (`registry/name:tag` or `name@sha256:...`).
    pub const IMAGE_BYTES_MAX: usize = 512;
    /// Ports one workload may expose.
    pub const PORTS_MAX: usize = 16;
    /// Sealed secret part, as hex, in characters (16 KiB of ciphertext).
    pub const SEALED_HEX_MAX: usize = 32 * 1024;
    /// Environment variables in the secret part.
    pub const ENV_MAX: usize = 128;
    /// Bytes of one environment variable's name plus value.
    pub const ENV_ENTRY_BYTES_MAX: usize = 4096;
    /// SSH public keys installed for the renter.
    pub const SSH_KEYS_MAX: usize = 16;
    /// Words in the command plus the arguments.
    pub const COMMAND_WORDS_MAX: usize = 256;
    /// Shared memory (`/dev/shm`) a workload may ask for, in MiB.
    pub const SHM_MIB_MAX: u32 = 256 * 1024;
    /// Restarts `on_failure` may ask for.
    pub const RESTARTS_MAX: u32 = 100;
    /// Bytes of container output one `lease_logs` request returns at most.
    pub const LOG_TAIL_BYTES_MAX: u32 = 32 * 1024;
    /// Bytes of a delivery status's reason text.
    pub const REASON_BYTES_MAX: usize = 512;
    /// Words of a `lease_exec` command, and its bytes in all.
    pub const EXEC_WORDS_MAX: usize = 64;
    pub const EXEC_BYTES_MAX: usize = 4096;
    /// How long a host waits for a `lease_exec` command, at most and by default.
    pub const EXEC_TIMEOUT_MS_MAX: u32 = 60_000;
    pub const EXEC_TIMEOUT_MS_DEFAULT: u32 = 30_000;
    /// Bytes of a command's output a `lease_exec` answer carries (the last).
    pub const EXEC_OUTPUT_BYTES_MAX: usize = 32 * 1024;
}

/// What a command run in a workload did (`lease_exec`), as its host tells
/// it: its exit code, the last of its output (stdout and stderr as they
/// came), whether it ran past its timeout (it is left running then, its
/// output so far returned), or why the host ran nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// `None` when it did not finish in time or never ran.
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub output: String,
    /// Output was cut to its last `EXEC_OUTPUT_BYTES_MAX` bytes.
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub timed_out: bool,
    /// Why nothing ran (the workload is not running, the backend runs no
    /// commands, the engine refused), in the host's words.
    #[serde(default)]
    pub refused: Option<String>,
}

impl ExecOutcome {
    /// Nothing ran, for `reason`.
    pub fn refused(reason: impl Into<String>) -> Self {
        ExecOutcome { refused: Some(reason.into()), ..ExecOutcome::default() }
    }

    /// Keeps the last `EXEC_OUTPUT_BYTES_MAX` bytes of `output` (on a
    /// character boundary) and a host's reason within `REASON_BYTES_MAX`.
    pub fn bounded(mut self) -> Self {
        if self.output.len() > limits::EXEC_OUTPUT_BYTES_MAX {
            let mut start = self.output.len() - limits::EXEC_OUTPUT_BYTES_MAX;
            while !self.output.is_char_boundary(start) {
                start += 1;
            }
            self.output = self.output.split_off(start);
            self.truncated = true;
        }
        if let Some(reason) = &mut self.refused {
            if reason.len() > limits::REASON_BYTES_MAX {
                let mut end = limits::REASON_BYTES_MAX;
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                reason.truncate(end);
            }
        }
        self
    }
}

/// Whether a `lease_exec` command is within the limits: 1 to
/// `EXEC_WORDS_MAX` words, `EXEC_BYTES_MAX` bytes, no NUL, and a timeout of
/// 1 to `EXEC_TIMEOUT_MS_MAX` ms.
pub fn exec_valid(command: &[String], timeout_ms: u32) -> bool {
    !command.is_empty()
        && command.len() <= limits::EXEC_WORDS_MAX
        && command.iter().map(String::len).sum::<usize>() <= limits::EXEC_BYTES_MAX
        && !command.iter().any(|word| word.contains('\0'))
        && (1..=limits::EXEC_TIMEOUT_MS_MAX).contains(&timeout_ms)
}

/// What the host does when the workload's main process exits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicy {
    /// Leave it exited (the lease runs on; the renter may set a new workload).
    #[default]
    Never,
    /// Start it again after a non-zero exit, at most `max_restarts` times.
    OnFailure { max_restarts: u32 },
    /// Start it again after every exit.
    Always,
}

/// The secret part of a workload, sealed to one host. `ciphertext` is the
/// hex of a sealed box (X25519 + XSalsa20-Poly1305, libsodium's
/// `crypto_box_seal`) of the JSON of [`Secrets`]; `recipient` is the hex of
/// the host encryption key it was sealed to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub recipient: String,
    pub ciphertext: String,
}

/// The renter's workload. The dangerous options exist on the wire only so
/// that asking for them is refused with a precise code: the exchange
/// refuses them (`workload_option_refused`), and the agent refuses them again
/// whatever reaches it; no delivery backend can set any of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Container image reference (the `process` backend ignores it).
    pub image: String,
    /// Container ports to publish on the host's public address (TCP).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Size of `/dev/shm` in MiB (0: the engine's default).
    #[serde(default)]
    pub shm_mib: u32,
    #[serde(default)]
    pub restart: RestartPolicy,
    /// The secret part, sealed to the lease's host. A bid cannot know its
    /// hosts, so a bid's workload says `secrets_follow` instead and the
    /// renter's client seals the secret part for each lease the bid fills.
    #[serde(default)]
    pub sealed: Option<Sealed>,
    /// The host waits (up to `SECRETS_WAIT_MS`) for sealed secrets sent with
    /// `set_workload` before it starts the workload.
    #[serde(default)]
    pub secrets_follow: bool,
    /// The exchange ends the lease (as the renter would: billed to the
    /// exit) when the host reports the workload exited, or failed to start
    /// for the renter's reason. Only with `restart` never: a workload that
    /// restarts has not ended when it exits.
    #[serde(default)]
    pub end_lease_on_exit: bool,
    /// Always refused.
    #[serde(default)]
    pub privileged: bool,
    /// Always refused.
    #[serde(default)]
    pub host_network: bool,
    /// Always refused when not empty (host paths to mount).
    #[serde(default)]
    pub host_mounts: Vec<String>,
    /// Always refused when not empty (Linux capabilities to add).
    #[serde(default)]
    pub cap_add: Vec<String>,
}

/// How long a host waits for a `secrets_follow` workload's secrets before it
/// reports the delivery failed (the renter's fault).
pub const SECRETS_WAIT_MS: u64 = 5 * 60_000;

impl Workload {
    /// A workload of `image` with nothing else set.
    pub fn image(image: impl Into<String>) -> Self {
        Workload {
            image: image.into(),
            ports: Vec::new(),
            shm_mib: 0,
            restart: RestartPolicy::Never,
            sealed: None,
            secrets_follow: false,
            end_lease_on_exit: false,
            privileged: false,
            host_network: false,
            host_mounts: Vec::new(),
            cap_add: Vec::new(),
        }
    }

    /// Checks the public part against [`limits`]; the exchange and the agent
    /// both run it.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.privileged || self.host_network || !self.host_mounts.is_empty() || !self.cap_add.is_empty() {
            return Err(WorkloadError::OptionRefused);
        }
        if !image_reference_valid(&self.image) {
            return Err(WorkloadError::ImageInvalid);
        }
        if self.ports.len() > limits::PORTS_MAX {
            return Err(WorkloadError::TooManyPorts);
        }
        let mut ports = self.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        if ports.len() != self.ports.len() || ports.first() == Some(&0) {
            return Err(WorkloadError::PortInvalid);
        }
        if self.shm_mib > limits::SHM_MIB_MAX {
            return Err(WorkloadError::ShmTooLarge);
        }
        if self.end_lease_on_exit && self.restart != RestartPolicy::Never {
            return Err(WorkloadError::EndOnExitRestarts);
        }
        if let RestartPolicy::OnFailure { max_restarts } = self.restart {
            if max_restarts > limits::RESTARTS_MAX {
                return Err(WorkloadError::TooManyRestarts);
            }
        }
        if let Some(sealed) = &self.sealed {
            if sealed.ciphertext.len() > limits::SEALED_HEX_MAX {
                return Err(WorkloadError::SealedTooLarge);
            }
            let hex_ok = |text: &str| text.bytes().all(|b| b.is_ascii_hexdigit()) && text.len().is_multiple_of(2);
            if sealed.recipient.len() != 64 || !hex_ok(&sealed.recipient) || !hex_ok(&sealed.ciphertext) {
                return Err(WorkloadError::SealedInvalid);
            }
        }
        Ok(())
    }
}

/// An image reference: `[registry/]name[:tag][@digest]`, lower-case path
/// components of letters, digits and `._-`, no whitespace or shell syntax.
fn image_reference_valid(image: &str) -> bool {
    if image.is_empty() || image.len() > limits::IMAGE_BYTES_MAX || image.starts_with(['-', '/', '.', ':']) {
        return false;
    }
    image.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
}

/// Why a workload was refused. The same codes come from the exchange (as
/// `error` codes) and from the agent (in a `failed` status).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadError {
    #[error("the image reference is empty, too long or not of the form [registry/]name[:tag][@digest]")]
    ImageInvalid,
    #[error("too many ports to expose")]
    TooManyPorts,
    #[error("a port is 0 or listed twice")]
    PortInvalid,
    #[error("shared memory above the limit")]
    ShmTooLarge,
    #[error("on_failure asks for more restarts than the limit")]
    TooManyRestarts,
    #[error("the sealed secret part is larger than the limit")]
    SealedTooLarge,
    #[error("the sealed secret part is not hex, or its recipient is not a 32-byte key")]
    SealedInvalid,
    #[error("privileged mode, host network, host mounts and added capabilities are never granted")]
    OptionRefused,
    #[error("too many environment variables, or one too long")]
    TooManyEnv,
    #[error("an environment variable name is empty or holds '=' or NUL")]
    EnvInvalid,
    #[error("too many SSH keys, or one that is not an OpenSSH public key line")]
    SshKeyInvalid,
    #[error("the command and arguments have too many words")]
    CommandTooLong,
    #[error("the readiness probe's port is 0 or its HTTP path does not start with / (printable, at most 256 bytes)")]
    ReadinessInvalid,
    #[error("the registry credentials are empty, too long or hold control characters")]
    RegistryAuthInvalid,
    #[error("end_lease_on_exit needs restart never: a workload that restarts has not ended when it exits")]
    EndOnExitRestarts,
}

/// The secret part: sealed to the host, never seen by the exchange.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secrets {
    /// Replaces the image's entrypoint when not empty.
    #[serde(default)]
    pub command: Vec<String>,
    /// Replaces the image's default arguments when not empty.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables as `(name, value)`.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// OpenSSH public key lines installed as `/root/.ssh/authorized_keys`.
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// How the host tells the workload is ready: `running` is reported once
    /// it answers here, rather than once it stayed up for the host's
    /// `ready_after_ms`. In the sealed part because the public part is
    /// journaled in a fixed layout; only the host needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
    /// Credentials for a private registry, used for this workload's pull only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryAuth>,
}

/// A readiness probe: a TCP connection to one of the workload's ports, or,
/// with `http_path`, an HTTP GET of that path answered 2xx or 3xx.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_path: Option<String>,
}

/// A private registry's credentials (Docker's `X-Registry-Auth`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
    /// The registry they are for (default: the image's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl Secrets {
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.env.len() > limits::ENV_MAX || self.env.iter().any(|(n, v)| n.len() + v.len() > limits::ENV_ENTRY_BYTES_MAX) {
            return Err(WorkloadError::TooManyEnv);
        }
        if self.env.iter().any(|(name, value)| name.is_empty() || name.contains(['=', '\0']) || value.contains('\0')) {
            return Err(WorkloadError::EnvInvalid);
        }
        let ssh_key_ok = |key: &str| {
            let mut words = key.split_whitespace();
            let kind = words.next().unwrap_or("");
            (kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-"))
                && words.next().is_some()
                && !key.contains('\n')
                && key.len() <= 16 * 1024
        };
        if self.ssh_keys.len() > limits::SSH_KEYS_MAX || !self.ssh_keys.iter().all(|k| ssh_key_ok(k)) {
            return Err(WorkloadError::SshKeyInvalid);
        }
        if self.command.len() + self.args.len() > limits::COMMAND_WORDS_MAX {
            return Err(WorkloadError::CommandTooLong);
        }
        if let Some(readiness) = &self.readiness {
            let path_ok = |path: &str| path.starts_with('/') && path.len() <= 256 && path.bytes().all(|b| b.is_ascii_graphic());
            if readiness.port == 0 || readiness.http_path.as_deref().is_some_and(|path| !path_ok(path)) {
                return Err(WorkloadError::ReadinessInvalid);
            }
        }
        if let Some(auth) = &self.registry_auth {
            let field_ok = |text: &str| text.len() <= 1024 && !text.contains(['\0', '\n', '\r']);
            if auth.username.is_empty()
                || !field_ok(&auth.username)
                || !field_ok(&auth.password)
                || !auth.server.as_deref().is_none_or(field_ok)
            {
                return Err(WorkloadError::RegistryAuthInvalid);
            }
        }
        Ok(())
    }

    /// Seals these secrets to a host's encryption key.
    pub fn seal(&self, host_encryption_key: &[u8; 32]) -> Sealed {
        let public = crypto_box::PublicKey::from(*host_encryption_key);
        let plaintext = serde_json::to_vec(self).expect("secrets serialise");
        let ciphertext = public.seal(&mut OsRng, &plaintext).expect("sealing a bounded message cannot fail");
        Sealed { recipient: hex::encode(host_encryption_key), ciphertext: hex::encode(ciphertext) }
    }
}

/// Why sealed secrets could not be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    #[error("sealed to another key")]
    WrongRecipient,
    #[error("the ciphertext is not hex, or does not open with this host's key")]
    Undecryptable,
    #[error("the opened secrets are not the documented JSON")]
    Malformed,
}

/// A host's X25519 key pair for sealed workloads.
pub struct EncryptionKey {
    secret: crypto_box::SecretKey,
}

impl EncryptionKey {
    pub fn from_bytes(secret: [u8; 32]) -> Self {
        EncryptionKey { secret: crypto_box::SecretKey::from(secret) }
    }

    pub fn public(&self) -> [u8; 32] {
        *self.secret.public_key().as_bytes()
    }

    pub fn unseal(&self, sealed: &Sealed) -> Result<Secrets, UnsealError> {
        if sealed.recipient != hex::encode(self.public()) {
            return Err(UnsealError::WrongRecipient);
        }
        let ciphertext = hex::decode(&sealed.ciphertext).map_err(|_| UnsealError::Undecryptable)?;
        let plaintext = self.secret.unseal(&ciphertext).map_err(|_| UnsealError::Undecryptable)?;
        serde_json::from_slice(&plaintext).map_err(|_| UnsealError::Malformed)
    }

    /// The host's signature binding this encryption key to its identity key.
    pub fn certify(&self, identity: &SigningKey) -> String {
        hex::encode(identity.sign(&encryption_key_payload(&self.public())).to_bytes())
    }
}

/// The bytes a host signs to publish its encryption key.
pub const ENCRYPTION_KEY_DOMAIN: &[u8] = b"gpux-encryption-key-v1:";

pub fn encryption_key_payload(key: &[u8; 32]) -> Vec<u8> {
    let mut payload = ENCRYPTION_KEY_DOMAIN.to_vec();
    payload.extend_from_slice(key);
    payload
}

/// Whether `signature` (hex) is the identity key's signature over the
/// encryption key, as `EncryptionKey::certify` makes it.
pub fn encryption_key_certified(encryption_key: &[u8; 32], identity_key: &[u8; 32], signature: &str) -> bool {
    let Ok(identity) = VerifyingKey::from_bytes(identity_key) else { return false };
    let Some(signature) = hex::decode(signature).ok().and_then(|b| <[u8; 64]>::try_from(b).ok()) else { return false };
    identity.verify(&encryption_key_payload(encryption_key), &Signature::from_bytes(&signature)).is_ok()
}

/// Whose side a failed delivery is on: the host's failures are refunded to
/// the renter (docs/market-rules.md "Delivery"), the renter's are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Host,
    Renter,
}

/// Why a delivery failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::VariantArray)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum FailureCode {
    /// The workload broke a limit or asked for a refused option (renter).
    WorkloadRefused,
    /// The image could not be pulled (renter: wrong name, private, absent).
    PullFailed,
    /// The sealed secrets did not open with the host's key, or broke a limit (renter).
    SecretsInvalid,
    /// The secrets a `secrets_follow` workload promised never came (renter).
    SecretsMissing,
    /// The workload's process could not be executed (renter: no such command in the image).
    ExecFailed,
    /// The host could not create or start the workload (host).
    HostError,
    /// The host's GPU became unavailable during start (host).
    GpuUnavailable,
    /// The host's container engine did not answer (host): its socket
    /// refused or timed out, as opposed to an engine that answered with an
    /// error about the renter's image or command.
    EngineUnavailable,
    /// A job's code bundle is not in the job store, or does not unpack to
    /// its hash (renter).
    BundleUnavailable,
    /// A job's input could not be fetched: not in the job store, its URL
    /// did not answer with it, or over its bounds (renter).
    InputUnavailable,
}

impl FailureCode {
    /// The code as the wire writes it (`pull_failed`).
    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn fault(self) -> Fault {
        match self {
            FailureCode::HostError | FailureCode::GpuUnavailable | FailureCode::EngineUnavailable => Fault::Host,
            FailureCode::WorkloadRefused
            | FailureCode::PullFailed
            | FailureCode::SecretsInvalid
            | FailureCode::SecretsMissing
            | FailureCode::ExecFailed
            | FailureCode::BundleUnavailable
            | FailureCode::InputUnavailable => Fault::Renter,
        }
    }

    /// The fixed text a host reports with this code when the detail could
    /// carry the renter's sealed values (a command path, an environment
    /// variable in an engine's error): the detail stays in the host's own
    /// log, and only this reaches the exchange and its journal.
    pub fn describe(self) -> &'static str {
        match self {
            FailureCode::WorkloadRefused => "the workload broke a limit or asked for a refused option",
            FailureCode::PullFailed => "the image could not be pulled",
            FailureCode::SecretsInvalid => "the sealed secrets did not open with the host's key or broke a limit",
            FailureCode::SecretsMissing => "the sealed secrets never came",
            FailureCode::ExecFailed => "the workload's command could not be executed in the image",
            FailureCode::HostError => "the host could not create or start the workload",
            FailureCode::GpuUnavailable => "a leased GPU became unavailable",
            FailureCode::EngineUnavailable => "the host's container engine did not answer",
            FailureCode::BundleUnavailable => "the job's code bundle is not in the job store or does not match its hash",
            FailureCode::InputUnavailable => "a job's input could not be fetched from the job store or its URL",
        }
    }
}

/// One published port: `host:port` reaches the container's `container_port`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub container_port: u16,
    pub host: String,
    pub port: u16,
}

/// A lease's delivery as the host reports it. Endpoints are sent in clear:
/// an address and a port are what a port scan finds anyway; what keeps the
/// workload the renter's is its SSH keys, sealed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for the sealed secrets of a `secrets_follow` workload.
    AwaitingSecrets,
    Pulling {
        bytes_done: u64,
        bytes_total: u64,
    },
    Starting,
    Running {
        endpoints: Vec<Endpoint>,
        /// `ssh -p PORT root@HOST` when port 22 is published and keys were given.
        ssh: Option<String>,
        restarts: u32,
    },
    /// The main process exited (the restart policy did not restart it); the
    /// lease runs on unless the workload asked `end_lease_on_exit`.
    Exited {
        code: i64,
    },
    Failed {
        code: FailureCode,
        fault: Fault,
        reason: String,
    },
    /// Stopped and removed at the lease's end.
    Stopped,
}

impl DeliveryState {
    pub fn name(&self) -> &'static str {
        match self {
            DeliveryState::AwaitingSecrets => "awaiting_secrets",
            DeliveryState::Pulling { .. } => "pulling",
            DeliveryState::Starting => "starting",
            DeliveryState::Running { .. } => "running",
            DeliveryState::Exited { .. } => "exited",
            DeliveryState::Failed { .. } => "failed",
            DeliveryState::Stopped => "stopped",
        }
    }

    /// Bounds what a host may report (reason length, endpoint count).
    pub fn valid(&self) -> bool {
        match self {
            DeliveryState::Failed { code, fault, reason } => reason.len() <= limits::REASON_BYTES_MAX && code.fault() == *fault,
            DeliveryState::Running { endpoints, ssh, .. } => {
                endpoints.len() <= limits::PORTS_MAX
                    && endpoints.iter().all(|e| e.host.len() <= 255)
                    && ssh.as_ref().is_none_or(|s| s.len() <= 300)
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> EncryptionKey {
        EncryptionKey::from_bytes([7; 32])
    }

    #[test]
    fn sealed_secrets_open_with_the_host_key_only() {
        let secrets = Secrets {
            command: vec!["/bin/sh".into()],
            args: vec!["-c".into(), "sleep 1".into()],
            env: vec![("TOKEN".into(), "s3cret-value".into())],
            ssh_keys: vec!["ssh-ed25519 AAAAC3Nza renter@laptop".into()],
            readiness: Some(Readiness { port: 8080, http_path: Some("/health".into()) }),
            registry_auth: Some(RegistryAuth { username: "renter".into(), password: "registry-token".into(), server: None }),
        };
        let sealed = secrets.seal(&key().public());
        assert!(!sealed.ciphertext.contains(&hex::encode("s3cret-value")));
        assert_eq!(key().unseal(&sealed), Ok(secrets.clone()));
        let other = EncryptionKey::from_bytes([8; 32]);
        assert_eq!(other.unseal(&sealed), Err(UnsealError::WrongRecipient));
        let forged = Sealed { recipient: hex::encode(other.public()), ..sealed.clone() };
        assert_eq!(other.unseal(&forged), Err(UnsealError::Undecryptable));
        // One ciphertext byte flipped (a fixed replacement would leave the
        // 1 in 256 ciphertexts that already hold it untouched).
        let mut tampered = sealed.clone();
        let byte = u8::from_str_radix(&tampered.ciphertext[70..72], 16).expect("hex");
        tampered.ciphertext.replace_range(70..72, &format!("{:02x}", byte ^ 0x01));
        assert_eq!(key().unseal(&tampered), Err(UnsealError::Undecryptable));
    }

    /// Sealed by the Python client (PyNaCl's SealedBox, clients/python
    /// gpux.Secrets.seal) to the key whose secret is the bytes 1..=32: the
    /// two implementations speak the same format.
    #[test]
    fn secrets_sealed_by_the_python_client_open_here() {
        let host: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
        let sealed = Sealed {
            recipient: "07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c".into(),
            ciphertext: "18bd44a7e7c68b80bb1055656713be5c3cb9cbac19ece9b8e4c1a283e27cf339001357bd279452ba0ce4893a830eae36854f57e8051a2d\
                         4694e3ac56479b4141a5e3b0565195878f3f5ca810e9a1c0ca0d96150923e37f11c6c12def1e77dd680bad2746a1701c70ad45e596bf6c66c1\
                         88c6cc4347051eb63c3a00156b9699f359780637d78bb9718b87099298ecd73f20fbbf5f7c83951fbf2a589da63fbd7218373077d84e1e87d8\
                         093a0b60d3c57d200ab48198c3949e36679a3112d200946f50dfbb128ff2a13ee9d024aa0a"
                .into(),
        };
        let secrets = EncryptionKey::from_bytes(host).unseal(&sealed).expect("PyNaCl's sealed box opens");
        assert_eq!(secrets.command, ["python", "-m", "http.server"]);
        assert_eq!(secrets.env, [("HF_TOKEN".to_string(), "hf_from_python".to_string())]);
        assert_eq!(secrets.ssh_keys, ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPython me@laptop"]);
    }

    #[test]
    fn an_encryption_key_is_certified_by_the_identity_key() {
        let identity = SigningKey::from_bytes(&[3; 32]);
        let signature = key().certify(&identity);
        let identity_public = identity.verifying_key().to_bytes();
        assert!(encryption_key_certified(&key().public(), &identity_public, &signature));
        assert!(!encryption_key_certified(&[9; 32], &identity_public, &signature));
        assert!(!encryption_key_certified(&key().public(), &[5; 32], &signature));
        assert!(!encryption_key_certified(&key().public(), &identity_public, "00"));
    }

    #[test]
    fn every_limit_and_refused_option_has_its_code() {
        let ok = Workload::image("localhost/gpux-test:busybox");
        assert_eq!(ok.validate(), Ok(()));
        let cases: Vec<(Workload, WorkloadError)> = vec![
            (Workload { privileged: true, ..ok.clone() }, WorkloadError::OptionRefused),
            (Workload { host_network: true, ..ok.clone() }, WorkloadError::OptionRefused),
            (Workload { host_mounts: vec!["/:/host".into()], ..ok.clone() }, WorkloadError::OptionRefused),
            (Workload { cap_add: vec!["SYS_ADMIN".into()], ..ok.clone() }, WorkloadError::OptionRefused),
            (Workload { end_lease_on_exit: true, restart: RestartPolicy::Always, ..ok.clone() }, WorkloadError::EndOnExitRestarts),
            (Workload::image(""), WorkloadError::ImageInvalid),
            (Workload::image("busybox; rm -rf /"), WorkloadError::ImageInvalid),
            (Workload::image("x".repeat(limits::IMAGE_BYTES_MAX + 1)), WorkloadError::ImageInvalid),
            (Workload { ports: (1..=17).collect(), ..ok.clone() }, WorkloadError::TooManyPorts),
            (Workload { ports: vec![0], ..ok.clone() }, WorkloadError::PortInvalid),
            (Workload { ports: vec![80, 80], ..ok.clone() }, WorkloadError::PortInvalid),
            (Workload { shm_mib: limits::SHM_MIB_MAX + 1, ..ok.clone() }, WorkloadError::ShmTooLarge),
            (Workload { restart: RestartPolicy::OnFailure { max_restarts: 101 }, ..ok.clone() }, WorkloadError::TooManyRestarts),
            (
                Workload { sealed: Some(Sealed { recipient: "00".repeat(32), ciphertext: "00".repeat(16_385) }), ..ok.clone() },
                WorkloadError::SealedTooLarge,
            ),
            (
                Workload { sealed: Some(Sealed { recipient: "zz".repeat(32), ciphertext: "00".into() }), ..ok.clone() },
                WorkloadError::SealedInvalid,
            ),
        ];
        for (workload, code) in cases {
            assert_eq!(workload.validate(), Err(code), "{workload:?}");
        }
        let secrets = Secrets::default();
        let secret_cases: Vec<(Secrets, WorkloadError)> = vec![
            (Secrets { env: (0..129).map(|i| (format!("V{i}"), String::new())).collect(), ..secrets.clone() }, WorkloadError::TooManyEnv),
            (Secrets { env: vec![("A".into(), "x".repeat(5000))], ..secrets.clone() }, WorkloadError::TooManyEnv),
            (Secrets { env: vec![("A=B".into(), "x".into())], ..secrets.clone() }, WorkloadError::EnvInvalid),
            (Secrets { env: vec![(String::new(), "x".into())], ..secrets.clone() }, WorkloadError::EnvInvalid),
            (Secrets { ssh_keys: vec!["not a key".into()], ..secrets.clone() }, WorkloadError::SshKeyInvalid),
            (Secrets { ssh_keys: vec!["ssh-ed25519 AAAA\ncommand".into()], ..secrets.clone() }, WorkloadError::SshKeyInvalid),
            (Secrets { args: vec!["x".into(); 257], ..secrets.clone() }, WorkloadError::CommandTooLong),
            (Secrets { readiness: Some(Readiness { port: 0, http_path: None }), ..secrets.clone() }, WorkloadError::ReadinessInvalid),
            (
                Secrets { readiness: Some(Readiness { port: 80, http_path: Some("health check".into()) }), ..secrets.clone() },
                WorkloadError::ReadinessInvalid,
            ),
            (
                Secrets {
                    registry_auth: Some(RegistryAuth { username: String::new(), password: "p".into(), server: None }),
                    ..secrets.clone()
                },
                WorkloadError::RegistryAuthInvalid,
            ),
        ];
        for (secrets, code) in secret_cases {
            assert_eq!(secrets.validate(), Err(code), "{secrets:?}");
        }
    }
}

//! The one error type of the nbd crate.

/// A protocol violation by the peer, and what the protocol says to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NbdError {
    /// The peer broke a rule that leaves no way to answer: close the connection.
    #[error("protocol violation: {0}")]
    Disconnect(String),

    /// A malformed option: answer it with this error reply and keep negotiating.
    #[error("invalid option {option}: {message}")]
    Option {
        /// The option code.
        option: u32,
        /// The error reply type to send (`NBD_REP_ERR_*`).
        reply: u32,
        /// A message for the user.
        message: String,
    },

    /// A request the server must refuse with an error reply (the connection stays usable).
    #[error("request refused with error {errno}: {message}")]
    Request {
        /// The protocol error number to reply with.
        errno: u32,
        /// A message for the user (sent in structured error chunks).
        message: String,
    },
}

/// Result with [`NbdError`].
pub type Result<T, E = NbdError> = std::result::Result<T, E>;

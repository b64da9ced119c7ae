//! The NBD protocol (NetworkBlockDevice/nbd `doc/proto.md`): a pure codec and, in
//! [`server`], a server over it.
//!
//! The codec has no sockets, no threads, no clocks. It decodes what clients send — the handshake's client flags, option
//! headers and data, request headers — with every check the protocol asks of a server, and
//! encodes what servers send: the greeting, option replies, simple replies and structured
//! reply chunks. The [`server`] drives it over real connections, for any storage that implements
//! [`server::Export`]; `locus serve` gives it the locus file system's files.
//!
//! Every decoder takes bytes from the network and answers either a value or an [`NbdError`]
//! that says what to do: disconnect, reply to the option with an error, or reply to the
//! request with an error and carry on. Limits are checked before anything is allocated.

pub mod consts;
mod error;
pub mod handshake;
pub mod option_reply;
pub mod options;
pub mod reply;
pub mod request;
pub mod server;

pub use error::{NbdError, Result};
pub use handshake::{ClientFlags, OptionHeader};
pub use options::NbdOption;
pub use request::{Limits, Request};

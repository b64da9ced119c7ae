//! Option requests, decoded from their data, with the checks the protocol asks for. A
//! malformed option becomes the error reply to send (`NBD_REP_ERR_INVALID`), never a panic.

use crate::consts::{MAX_STRING_BYTES, option, reply};
use crate::error::{NbdError, Result};

/// Largest option data the server reads; longer options are skipped and refused with
/// `NBD_REP_ERR_TOO_BIG` before anything is allocated.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// Most metadata-context queries in one option.
pub const MAX_QUERIES: u32 = 128;
/// Most information requests in `NBD_OPT_INFO`/`GO`.
pub const MAX_INFO_REQUESTS: u16 = 64;

/// `NBD_REP_ERR_TOO_BIG`.
pub const ERR_TOO_BIG: u32 = reply::ERROR_BIT | 9;
/// `NBD_REP_ERR_UNSUP`.
pub const ERR_UNSUP: u32 = reply::ERROR_BIT | 1;
/// `NBD_REP_ERR_POLICY`.
pub const ERR_POLICY: u32 = reply::ERROR_BIT | 2;
/// `NBD_REP_ERR_INVALID`.
pub const ERR_INVALID: u32 = reply::ERROR_BIT | 3;
/// `NBD_REP_ERR_TLS_REQD`: the server requires TLS first.
pub const ERR_TLS_REQD: u32 = reply::ERROR_BIT | 5;
/// `NBD_REP_ERR_UNKNOWN` (no such export).
pub const ERR_UNKNOWN: u32 = reply::ERROR_BIT | 6;

/// A decoded option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdOption {
    /// Choose an export and enter transmission.
    ExportName(String),
    /// End negotiation.
    Abort,
    /// List exports.
    List,
    /// Upgrade to TLS.
    StartTls,
    /// Ask about an export (`go` false) or ask and enter transmission (`go` true).
    Info {
        /// Enter transmission on success.
        go: bool,
        /// Export name.
        name: String,
        /// Information types the client asked for.
        requests: Vec<u16>,
    },
    /// Use structured replies.
    StructuredReply,
    /// List (`set` false) or select (`set` true) metadata contexts.
    MetaContext {
        /// Select rather than list.
        set: bool,
        /// Export name.
        name: String,
        /// Queries (none: all contexts, for listing).
        queries: Vec<String>,
    },
    /// An option locus does not implement; answered with `NBD_REP_ERR_UNSUP`.
    Unknown(u32),
}

impl NbdOption {
    /// Decodes option `code` from its data.
    pub fn decode(code: u32, data: &[u8]) -> Result<Self> {
        let mut reader = Reader { code, data, at: 0 };
        let decoded = match code {
            // EXPORT_NAME cannot be answered with an error: any problem ends the session.
            option::EXPORT_NAME => {
                Self::ExportName(reader.rest_as_string("export name").map_err(|e| match e {
                    NbdError::Option { message, .. } => NbdError::Disconnect(message),
                    other => other,
                })?)
            }
            option::ABORT => reader.empty(Self::Abort)?,
            option::LIST => reader.empty(Self::List)?,
            option::STARTTLS => reader.empty(Self::StartTls)?,
            option::STRUCTURED_REPLY => reader.empty(Self::StructuredReply)?,
            option::INFO | option::GO => {
                let name = reader.string("export name")?;
                let count = reader.u16("number of information requests")?;
                if count > MAX_INFO_REQUESTS {
                    return Err(reader.invalid(format!(
                        "{count} information requests (at most {MAX_INFO_REQUESTS})"
                    )));
                }
                let requests = (0..count)
                    .map(|_| reader.u16("information request"))
                    .collect::<Result<_>>()?;
                reader.end()?;
                Self::Info {
                    go: code == option::GO,
                    name,
                    requests,
                }
            }
            option::LIST_META_CONTEXT | option::SET_META_CONTEXT => {
                let name = reader.string("export name")?;
                let count = reader.u32("number of queries")?;
                if count > MAX_QUERIES {
                    return Err(reader.invalid(format!("{count} queries (at most {MAX_QUERIES})")));
                }
                let queries = (0..count)
                    .map(|_| reader.string("query"))
                    .collect::<Result<_>>()?;
                reader.end()?;
                Self::MetaContext {
                    set: code == option::SET_META_CONTEXT,
                    name,
                    queries,
                }
            }
            other => Self::Unknown(other),
        };
        Ok(decoded)
    }
}

struct Reader<'a> {
    code: u32,
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn invalid(&self, message: String) -> NbdError {
        NbdError::Option {
            option: self.code,
            reply: ERR_INVALID,
            message,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        if self.data.len() - self.at < n {
            return Err(self.invalid(format!("data ends inside the {what}")));
        }
        let bytes = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(bytes)
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_be_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_be_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u32(&format!("length of the {what}"))? as usize;
        if len > MAX_STRING_BYTES {
            return Err(self.invalid(format!(
                "{what} of {len} bytes (at most {MAX_STRING_BYTES})"
            )));
        }
        let bytes = self.take(len, what)?.to_vec();
        self.text(bytes, what)
    }

    fn rest_as_string(&mut self, what: &str) -> Result<String> {
        let rest = self.data[self.at..].to_vec();
        self.at = self.data.len();
        if rest.len() > MAX_STRING_BYTES {
            return Err(NbdError::Disconnect(format!(
                "{what} of {} bytes (at most {MAX_STRING_BYTES})",
                rest.len()
            )));
        }
        self.text(rest, what)
    }

    fn text(&self, bytes: Vec<u8>, what: &str) -> Result<String> {
        if bytes.contains(&0) {
            return Err(self.invalid(format!("{what} contains NUL")));
        }
        String::from_utf8(bytes).map_err(|_| self.invalid(format!("{what} is not UTF-8")))
    }

    fn empty(&self, value: NbdOption) -> Result<NbdOption> {
        self.end()?;
        Ok(value)
    }

    fn end(&self) -> Result<()> {
        if self.at != self.data.len() {
            return Err(self.invalid(format!(
                "{} unexpected trailing bytes",
                self.data.len() - self.at
            )));
        }
        Ok(())
    }
}

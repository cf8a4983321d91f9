use std::io;

/// Everything that can go wrong reading or writing kedge frames.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A frame announced or needed more than the maximum frame size.
    #[error("frame{} exceeds the {max}-byte limit", size.map(|s| format!(" of {s} bytes")).unwrap_or_default())]
    FrameTooLarge {
        /// Size of the offending frame, when known (a received frame is refused from its length
        /// prefix, before its size is worth reporting).
        size: Option<usize>,
        /// The enforced limit.
        max: usize,
    },
    /// The frame's bytes are not a valid message of the expected direction.
    #[error("undecodable frame: {0}")]
    Decode(#[source] postcard::Error),
    /// The frame decoded to a message but had bytes left over.
    #[error("frame has {0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A message could not be serialized.
    #[error("cannot encode message: {0}")]
    Encode(#[source] postcard::Error),
    /// The stream ended in the middle of a frame.
    #[error("stream ended inside a frame")]
    Truncated,
    /// The underlying stream failed.
    #[error("stream I/O: {0}")]
    Io(#[from] io::Error),
}

/// Result with the protocol [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

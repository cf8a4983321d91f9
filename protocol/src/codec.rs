//! Framing: a big-endian `u32` length prefix, then one postcard-encoded message.

use std::marker::PhantomData;

use bytes::{Buf, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use serde::{Serialize, de::DeserializeOwned};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Decoder, Encoder, FramedRead, FramedWrite, LengthDelimitedCodec};

use crate::{Error, MAX_FRAME_BYTES, Result};

const PREFIX_LEN: usize = 4;

/// Serializes one message into a frame payload, refusing payloads over [`MAX_FRAME_BYTES`].
pub fn encode<M: Serialize>(message: &M) -> Result<Bytes> {
    let bytes = postcard::to_stdvec(message).map_err(Error::Encode)?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(Error::FrameTooLarge {
            size: bytes.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(bytes.into())
}

/// Decodes one frame payload into exactly one message; trailing bytes are an error.
///
/// Never panics, whatever the input.
pub fn decode<M: DeserializeOwned>(payload: &[u8]) -> Result<M> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(Error::FrameTooLarge {
            size: payload.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let (message, rest) = postcard::take_from_bytes(payload).map_err(Error::Decode)?;
    if !rest.is_empty() {
        return Err(Error::TrailingBytes(rest.len()));
    }
    Ok(message)
}

/// Length-delimited framing with a hard size cap that reports oversized and truncated frames
/// as typed errors.
#[derive(Debug)]
struct FrameCodec {
    inner: LengthDelimitedCodec,
    max: usize,
}

impl FrameCodec {
    fn new(max: usize) -> Self {
        let inner = LengthDelimitedCodec::builder()
            .length_field_length(PREFIX_LEN)
            .max_frame_length(max)
            .new_codec();
        Self { inner, max }
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>> {
        // Check the announced length ourselves so the error can say how big the frame was.
        if src.len() >= PREFIX_LEN {
            let announced = (&src[..PREFIX_LEN]).get_u32() as usize;
            if announced > self.max {
                return Err(Error::FrameTooLarge {
                    size: announced,
                    max: self.max,
                });
            }
        }
        Ok(self.inner.decode(src)?)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(Error::Truncated),
        }
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = Error;

    fn encode(&mut self, payload: Bytes, dst: &mut BytesMut) -> Result<()> {
        if payload.len() > self.max {
            return Err(Error::FrameTooLarge {
                size: payload.len(),
                max: self.max,
            });
        }
        Ok(self.inner.encode(payload, dst)?)
    }
}

/// A bidirectional stream of kedge frames: receives `In` messages, sends `Out` messages.
///
/// Every read is capped at the maximum frame size; a clean end of stream reads as `Ok(None)`.
#[derive(Debug)]
pub struct FramedStream<R, W, In, Out> {
    reader: FramedRead<R, FrameCodec>,
    writer: FramedWrite<W, FrameCodec>,
    _messages: PhantomData<fn(Out) -> In>,
}

impl<R, W, In, Out> FramedStream<R, W, In, Out>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    In: DeserializeOwned,
    Out: Serialize,
{
    /// Frames a read half and a write half with the default [`MAX_FRAME_BYTES`] limit.
    pub fn new(reader: R, writer: W) -> Self {
        Self::with_max_frame(reader, writer, MAX_FRAME_BYTES)
    }

    /// Frames a stream with a custom frame-size limit (tests use small ones).
    pub fn with_max_frame(reader: R, writer: W, max: usize) -> Self {
        let max = max.min(MAX_FRAME_BYTES);
        Self {
            reader: FramedRead::new(reader, FrameCodec::new(max)),
            writer: FramedWrite::new(writer, FrameCodec::new(max)),
            _messages: PhantomData,
        }
    }

    /// Reads the next message; `Ok(None)` when the peer finished the stream cleanly.
    pub async fn recv(&mut self) -> Result<Option<In>> {
        match self.reader.next().await {
            None => Ok(None),
            Some(frame) => decode(&frame?).map(Some),
        }
    }

    /// Encodes and writes one message, flushing it to the transport.
    pub async fn send(&mut self, message: &Out) -> Result<()> {
        let payload = encode(message)?;
        self.writer.send(payload).await
    }

    /// Finishes the write half (for QUIC: sends FIN) after flushing what was queued.
    pub async fn finish(&mut self) -> Result<()> {
        // Closing the sink flushes it, then shuts the transport's write half down.
        self.writer.close().await
    }

    /// The write half, e.g. to reset a QUIC stream with an error code.
    pub fn writer_mut(&mut self) -> &mut W {
        self.writer.get_mut()
    }

    /// The read half, e.g. to stop a QUIC stream with an error code.
    pub fn reader_mut(&mut self) -> &mut R {
        self.reader.get_mut()
    }
}

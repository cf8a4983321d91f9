//! Framing: a big-endian `u32` length prefix, then one postcard-encoded message.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use serde::{Serialize, de::DeserializeOwned};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Decoder, Encoder, FramedRead, FramedWrite};

use crate::{Error, MAX_FRAME_BYTES, Result};

const PREFIX_LEN: usize = 4;

/// Serializes one message into a frame payload, refusing payloads over [`MAX_FRAME_BYTES`].
pub fn encode<M: Serialize>(message: &M) -> Result<Bytes> {
    let bytes = postcard::to_stdvec(message).map_err(Error::Encode)?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(Error::FrameTooLarge {
            size: Some(bytes.len()),
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
            size: Some(payload.len()),
            max: MAX_FRAME_BYTES,
        });
    }
    let (message, rest) = postcard::take_from_bytes(payload).map_err(Error::Decode)?;
    if !rest.is_empty() {
        return Err(Error::TrailingBytes(rest.len()));
    }
    Ok(message)
}

/// Length-delimited framing (big-endian `u32` prefix) with a hard size cap.
///
/// Written out rather than wrapping `LengthDelimitedCodec`, because that codec consumes a
/// frame's header before the body arrives and hides that it is mid-frame: then neither an
/// oversized announcement can be reported with its size, nor a stream that ends after a
/// header be told apart from a clean end.
/// What a stream's read buffer starts with: a heartbeat or an ack fits.
const INITIAL_READ_BYTES: usize = 256;
/// A buffer left larger than this by a big frame is given back once it is empty.
const KEEP_IDLE_BYTES: usize = 16 * 1024;

/// Gives back an empty buffer's memory when a large frame left it bigger than
/// [`KEEP_IDLE_BYTES`].
fn shrink_idle(buffer: &mut BytesMut, initial: usize) {
    if buffer.is_empty() && buffer.capacity() > KEEP_IDLE_BYTES {
        *buffer = BytesMut::with_capacity(initial);
    }
}

#[derive(Debug)]
struct FrameCodec {
    max: usize,
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>> {
        let Some(prefix) = src.first_chunk::<PREFIX_LEN>() else {
            return Ok(None);
        };
        let announced = u32::from_be_bytes(*prefix) as usize;
        if announced > self.max {
            return Err(Error::FrameTooLarge {
                size: Some(announced),
                max: self.max,
            });
        }
        let needed = PREFIX_LEN + announced;
        if src.len() < needed {
            src.reserve(needed - src.len());
            return Ok(None);
        }
        src.advance(PREFIX_LEN);
        Ok(Some(src.split_to(announced)))
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
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|len| *len as usize <= self.max)
            .ok_or(Error::FrameTooLarge {
                size: Some(payload.len()),
                max: self.max,
            })?;
        dst.reserve(PREFIX_LEN + payload.len());
        dst.put_u32(len);
        dst.extend_from_slice(&payload);
        Ok(())
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
        let mut writer = FramedWrite::new(writer, FrameCodec { max });
        // tokio-util starts each buffer at 8 KiB: 32 KiB per session for two idle streams, on
        // a hub holding thousands of sessions. They start small and grow with the frames.
        *writer.write_buffer_mut() = BytesMut::new();
        Self {
            reader: FramedRead::with_capacity(reader, FrameCodec { max }, INITIAL_READ_BYTES),
            writer,
            _messages: PhantomData,
        }
    }

    /// Reads the next message; `Ok(None)` when the peer finished the stream cleanly.
    pub async fn recv(&mut self) -> Result<Option<In>> {
        let frame = self.reader.next().await;
        shrink_idle(self.reader.read_buffer_mut(), INITIAL_READ_BYTES);
        match frame {
            None => Ok(None),
            Some(frame) => decode(&frame?).map(Some),
        }
    }

    /// Encodes and writes one message, flushing it to the transport.
    pub async fn send(&mut self, message: &Out) -> Result<()> {
        let payload = encode(message)?;
        let sent = self.writer.send(payload).await;
        shrink_idle(self.writer.write_buffer_mut(), 0);
        sent
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

#[cfg(test)]
mod tests {
    use super::*;

    type Pipe = FramedStream<
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
        Vec<u8>,
        Vec<u8>,
    >;

    fn pipe(stream: tokio::io::DuplexStream) -> Pipe {
        let (r, w) = tokio::io::split(stream);
        FramedStream::new(r, w)
    }

    #[tokio::test]
    async fn idle_streams_hold_small_buffers_and_give_back_what_a_big_frame_took() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let (mut a, mut b) = (pipe(a), pipe(b));
        assert!(a.reader.read_buffer().capacity() <= INITIAL_READ_BYTES);
        assert_eq!(a.writer.write_buffer().capacity(), 0);

        let big = vec![7u8; 200_000];
        a.send(&big).await.unwrap();
        assert!(a.writer.write_buffer().capacity() <= KEEP_IDLE_BYTES);
        assert_eq!(b.recv().await.unwrap(), Some(big));
        assert!(b.reader.read_buffer().capacity() <= KEEP_IDLE_BYTES);

        // Small frames keep working after the shrink.
        a.send(&vec![1, 2, 3]).await.unwrap();
        assert_eq!(b.recv().await.unwrap(), Some(vec![1, 2, 3]));
    }
}

//! Primitive payload encodings: big-endian integers, length-prefixed strings and byte strings,
//! and [`PayloadError`], why a payload does not decode. Every payload module builds on this one.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Why a frame's payload is not the message its opcode announces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("opcode 0x{0:02X} is not defined by this protocol version")]
    UnknownOpcode(u8),
    #[error("opcode 0x{0:02X} is not a request")]
    NotARequest(u8),
    #[error("opcode 0x{0:02X} is not a response")]
    NotAResponse(u8),
    #[error("payload ends inside {0}")]
    Truncated(&'static str),
    #[error("{0} has an undefined tag {1}")]
    BadTag(&'static str, u8),
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("{0} bytes left over after the message")]
    TrailingBytes(usize),
}

/// A cursor over a payload that refuses to read past its end.
pub(crate) struct Reader {
    buf: Bytes,
    field: &'static str,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Reader {
        Reader {
            buf,
            field: "payload",
        }
    }

    /// Names the field being read, for error messages.
    pub(crate) fn at(&mut self, field: &'static str) -> &mut Reader {
        self.field = field;
        self
    }

    fn need(&self, n: usize) -> Result<(), PayloadError> {
        if self.buf.remaining() < n {
            Err(PayloadError::Truncated(self.field))
        } else {
            Ok(())
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, PayloadError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn u16(&mut self) -> Result<u16, PayloadError> {
        self.need(2)?;
        Ok(self.buf.get_u16())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, PayloadError> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }

    pub(crate) fn u64(&mut self) -> Result<u64, PayloadError> {
        self.need(8)?;
        Ok(self.buf.get_u64())
    }

    pub(crate) fn i64(&mut self) -> Result<i64, PayloadError> {
        self.need(8)?;
        Ok(self.buf.get_i64())
    }

    pub(crate) fn f64(&mut self) -> Result<f64, PayloadError> {
        self.need(8)?;
        Ok(self.buf.get_f64())
    }

    /// An `f64` sent little endian (SAMPLE's samples, SPEC.md §6.12).
    pub(crate) fn f64_le(&mut self) -> Result<f64, PayloadError> {
        self.need(8)?;
        Ok(self.buf.get_f64_le())
    }

    pub(crate) fn bool(&mut self) -> Result<bool, PayloadError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(PayloadError::BadTag(self.field, other)),
        }
    }

    pub(crate) fn bytes(&mut self) -> Result<Bytes, PayloadError> {
        let len = usize::from(self.u16()?);
        self.need(len)?;
        Ok(self.buf.split_to(len))
    }

    pub(crate) fn string(&mut self) -> Result<String, PayloadError> {
        let field = self.field;
        let raw = self.bytes()?;
        String::from_utf8(raw.to_vec()).map_err(|_| PayloadError::NotUtf8(field))
    }

    /// A count of items, refused when the payload cannot hold that many of `min_item_len`.
    pub(crate) fn count(&mut self, min_item_len: usize) -> Result<usize, PayloadError> {
        let n = usize::from(self.u16()?);
        if n.saturating_mul(min_item_len) > self.buf.remaining() {
            return Err(PayloadError::Truncated(self.field));
        }
        Ok(n)
    }

    pub(crate) fn finish(self) -> Result<(), PayloadError> {
        if self.buf.has_remaining() {
            Err(PayloadError::TrailingBytes(self.buf.remaining()))
        } else {
            Ok(())
        }
    }
}

/// Writes primitives. A string or byte string longer than 65 535 bytes is cut to 65 535 bytes,
/// which with its length prefix is more than a payload may hold, so the message is refused as
/// too large: never sent cut short.
pub(crate) trait Writer {
    fn put_string(&mut self, s: &str);
    fn put_blob(&mut self, b: &[u8]);
    fn put_count(&mut self, n: usize);
}

impl Writer for BytesMut {
    fn put_string(&mut self, s: &str) {
        self.put_blob(s.as_bytes());
    }

    fn put_blob(&mut self, b: &[u8]) {
        let len = b.len().min(u16::MAX as usize);
        self.put_u16(len as u16);
        self.put_slice(&b[..len]);
    }

    fn put_count(&mut self, n: usize) {
        self.put_u16(u16::try_from(n).unwrap_or(u16::MAX));
    }
}

//! A writer for the `newc` cpio format, the format of a Linux initramfs.

use std::io::{self, Write};

pub struct CpioWriter<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFCHR: u32 = 0o020000;

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        CpioWriter {
            out,
            ino: 1,
            written: 0,
        }
    }

    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..pad])
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let namesize = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            if mode & S_IFDIR != 0 { 2 } else { 1 },
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            namesize,
            0
        );
        self.ino += 1;
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    pub fn dir(&mut self, name: &str, perm: u32) -> io::Result<()> {
        self.entry(name, S_IFDIR | perm, (0, 0), &[])
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, S_IFREG | perm, (0, 0), data)
    }

    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, S_IFCHR | perm, (major, minor), &[])
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        Ok(self.out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_trailer_terminates() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("dev", 0o755).unwrap();
        w.file("init", 0o755, b"abcde").unwrap();
        w.char_dev("dev/console", 0o600, 5, 1).unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("init\0"));
        assert!(text.contains("abcde"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!"));
        // The file entry's header says 5 bytes of data.
        let init_hdr = text.find("init\0").unwrap() - 110;
        assert_eq!(&text[init_hdr + 54..init_hdr + 62], "00000005");
    }
}

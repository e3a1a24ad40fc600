//! A running guest's RAM as its QEMU maps it, and the pages written since it was restored.
//!
//! Every VM maps its RAM file private (`memory-backend-file,share=off`): a snapshot's or a
//! template's `mem`, or an empty sparse file for a cold boot. A page the guest (or QEMU) writes
//! becomes the QEMU process's own anonymous page; every other page is still the file's. So the
//! guest's memory at an instant is *the file plus the written pages*, and
//! `/proc/PID/pagemap` says which pages those are: present and no longer file-backed (bit 61
//! clear), or swapped out (bit 62; only anonymous pages of a private file mapping go to swap).
//! Saving a sandbox copies that set and nothing else, so its cost follows what the guest
//! changed, not the size of its RAM.

use std::io;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes per page of the host (and of the pagemap's entries).
const PAGE: u64 = 4096;
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const FILE_OR_SHARED: u64 = 1 << 61;
/// Most runs one `process_vm_readv` takes (the kernel's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Where a RAM file is mapped in a process.
#[derive(Debug, Clone)]
pub struct GuestRam {
    pid: u32,
    start: u64,
    len: u64,
    file: PathBuf,
}

impl GuestRam {
    /// The RAM of QEMU process `pid`: its `memory-backend-file` with `share=off`, from its
    /// command line, found in its memory map.
    pub fn of_qemu(pid: u32) -> io::Result<GuestRam> {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let file = cmdline
            .split(|b| *b == 0)
            .map(String::from_utf8_lossy)
            .filter(|a| a.starts_with("memory-backend-file,") && a.contains(",share=off"))
            .find_map(|a| {
                a.split(',')
                    .find_map(|kv| kv.strip_prefix("mem-path=").map(PathBuf::from))
            })
            .ok_or_else(|| {
                io::Error::other(
                    "the VM's RAM is not a private file mapping (a VM started by an older forkbox)",
                )
            })?;
        GuestRam::find(pid, &file)
    }

    /// The mapping of `file` (all of it, from offset 0) in process `pid`, matched by device and
    /// inode (the path a jailed process's map shows is not the host's).
    pub fn find(pid: u32, file: &Path) -> io::Result<GuestRam> {
        let meta = std::fs::metadata(file)?;
        let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let mut parts: Vec<(u64, u64, u64)> = maps
            .lines()
            .filter_map(|line| {
                let mut f = line.split_whitespace();
                let (range, _perms, offset, dev, inode) =
                    (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
                let (maj, min) = dev.split_once(':')?;
                let same = u32::from_str_radix(maj, 16).ok()? == major
                    && u32::from_str_radix(min, 16).ok()? == minor
                    && inode.parse::<u64>().ok()? == meta.ino();
                if !same {
                    return None;
                }
                let (a, b) = range.split_once('-')?;
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                    u64::from_str_radix(offset, 16).ok()?,
                ))
            })
            .collect();
        parts.sort_unstable();
        // One mapping, possibly split into several areas: contiguous, offsets following.
        let whole = parts.first().is_some_and(|&(start, _, off)| {
            off == 0
                && parts
                    .windows(2)
                    .all(|w| w[0].1 == w[1].0 && w[1].2 == w[1].0 - start)
                && parts.last().map(|p| p.1 - start) == Some(meta.len())
        });
        match parts.first() {
            Some(&(start, _, _)) if whole => Ok(GuestRam {
                pid,
                start,
                len: meta.len(),
                file: file.to_path_buf(),
            }),
            _ => Err(io::Error::other(format!(
                "process {pid} does not map all of {} once",
                file.display()
            ))),
        }
    }

    /// The file the mapping reads its unwritten pages from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Bytes of RAM (the file's length).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pages written since the mapping was made, as byte ranges of the RAM (adjacent pages
    /// merged), in order: from the kernel's `PAGEMAP_SCAN` (Linux 6.7), which hands back the
    /// runs themselves, else by reading an entry of `/proc/PID/pagemap` per page.
    pub fn written(&self) -> io::Result<Vec<Range<u64>>> {
        let pagemap = std::fs::File::open(format!("/proc/{}/pagemap", self.pid))?;
        match self.written_by_scan(&pagemap, 4096) {
            // ENOTTY: a kernel before 6.7.
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => self.written_by_reading(&pagemap),
            r => r,
        }
    }

    fn written_by_scan(
        &self,
        pagemap: &std::fs::File,
        batch: usize,
    ) -> io::Result<Vec<Range<u64>>> {
        use std::os::fd::AsRawFd;
        let end = self.start + self.len.div_ceil(PAGE) * PAGE;
        let mut regions = vec![PageRegion::default(); batch];
        let mut found: Vec<Range<u64>> = Vec::new();
        let mut at = self.start;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: 0,
                start: at,
                end,
                walk_end: 0,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                max_pages: 0,
                // Written: not the file's page (a copy of its own) and present or swapped out.
                category_inverted: PAGE_IS_FILE,
                category_mask: PAGE_IS_FILE,
                category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            };
            // SAFETY: `arg` is a `pm_scan_arg` of the kernel's layout (its size in `size`);
            // `vec` points at `vec_len` writable `page_region`s that outlive the call. The
            // kernel writes only `walk_end` and those regions.
            let n = unsafe { pagemap_scan(pagemap.as_raw_fd(), &mut arg) }
                .map_err(io::Error::from)? as usize;
            found.extend(regions[..n.min(regions.len())].iter().map(|r| {
                r.start.clamp(self.start, end) - self.start
                    ..(r.end.clamp(self.start, end) - self.start).min(self.len)
            }));
            if arg.walk_end <= at {
                return Err(io::Error::other("the page map scan made no progress"));
            }
            // Where the walk ended, which may be before the last region it reported (seen on
            // 6.18): the next call reports some again.
            at = arg.walk_end;
        }
        found.sort_unstable_by_key(|r| r.start);
        let mut runs: Vec<Range<u64>> = Vec::with_capacity(found.len());
        for r in found.into_iter().filter(|r| r.start < r.end) {
            match runs.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => runs.push(r),
            }
        }
        Ok(runs)
    }

    fn written_by_reading(&self, pagemap: &std::fs::File) -> io::Result<Vec<Range<u64>>> {
        use std::os::unix::fs::FileExt;
        let pages = self.len.div_ceil(PAGE);
        let first = self.start / PAGE;
        let mut runs: Vec<Range<u64>> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024 * 8];
        let mut page = 0;
        while page < pages {
            let n = ((pages - page) as usize).min(buf.len() / 8);
            let bytes = &mut buf[..n * 8];
            pagemap.read_exact_at(bytes, (first + page) * 8)?;
            for (i, e) in bytes.chunks_exact(8).enumerate() {
                let mut entry = [0u8; 8];
                entry.copy_from_slice(e);
                let e = u64::from_ne_bytes(entry);
                if written(e) {
                    let at = (page + i as u64) * PAGE;
                    match runs.last_mut() {
                        Some(r) if r.end == at => r.end = (at + PAGE).min(self.len),
                        _ => runs.push(at..(at + PAGE).min(self.len)),
                    }
                }
            }
            page += n as u64;
        }
        Ok(runs)
    }
}

/// `struct pm_scan_arg` of `<linux/fs.h>`.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;

nix::ioctl_readwrite!(pagemap_scan, b'f', 16, PmScanArg);

impl GuestRam {
    /// Copies the bytes of `runs` out of the process straight into the same places of `dest`
    /// (the new RAM file, mapped shared): one memory copy per page and no system call per
    /// run, on two threads when there is much to copy. Kept mapped between a save's two
    /// passes, the second finds every page of the first in place and so copies without a
    /// fault. Returns the bytes copied.
    pub fn copy_into(&self, runs: &[Range<u64>], dest: &mut [u8]) -> io::Result<u64> {
        if runs
            .iter()
            .any(|r| r.end > self.len || r.end > dest.len() as u64)
        {
            return Err(io::Error::other("page runs past the RAM"));
        }
        let total: u64 = runs.iter().map(|r| r.end - r.start).sum();
        if total < 16 << 20 {
            return self.copy_part(runs, dest, 0);
        }
        // Pieces of at most 4 MiB, split where half the bytes are.
        let pieces: Vec<Range<u64>> = runs
            .iter()
            .flat_map(|r| {
                (r.start..r.end)
                    .step_by(4 << 20)
                    .map(move |a| a..(a + (4 << 20)).min(r.end))
            })
            .collect();
        let runs = &pieces[..];
        let mut acc = 0;
        let cut = runs
            .iter()
            .position(|r| {
                acc += r.end - r.start;
                acc >= total / 2
            })
            .map_or(runs.len(), |i| i + 1)
            .min(runs.len() - 1);
        let (lo, hi) = runs.split_at(cut);
        let at = hi[0].start;
        let (dlo, dhi) = dest.split_at_mut(at as usize);
        std::thread::scope(|s| {
            let other = s.spawn(|| self.copy_part(hi, dhi, at));
            let mine = self.copy_part(lo, dlo, 0);
            let theirs = other
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a copy thread panicked")));
            Ok(mine? + theirs?)
        })
    }

    /// [`GuestRam::copy_into`] for runs (all at or past `base`) into `dest`, which holds the
    /// RAM from offset `base` on.
    fn copy_part(&self, runs: &[Range<u64>], dest: &mut [u8], base: u64) -> io::Result<u64> {
        use nix::sys::uio::{process_vm_readv, RemoteIoVec};
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let mut copied = 0u64;
        for batch in runs.chunks(IOV_MAX) {
            // Disjoint pieces of `dest`, in order: split off one after the other.
            let mut rest: &mut [u8] = &mut dest[..];
            let mut at = base;
            let mut local = Vec::with_capacity(batch.len());
            for r in batch {
                let tail = std::mem::take(&mut rest);
                let (_, tail) = tail.split_at_mut((r.start - at) as usize);
                let (piece, tail) = tail.split_at_mut((r.end - r.start) as usize);
                local.push(io::IoSliceMut::new(piece));
                rest = tail;
                at = r.end;
            }
            let remote: Vec<RemoteIoVec> = batch
                .iter()
                .map(|r| RemoteIoVec {
                    base: (self.start + r.start) as usize,
                    len: (r.end - r.start) as usize,
                })
                .collect();
            let want: u64 = batch.iter().map(|r| r.end - r.start).sum();
            let got = process_vm_readv(pid, &mut local, &remote)? as u64;
            if got != want {
                return Err(io::Error::other(format!(
                    "read {got} of {want} bytes of the guest's RAM"
                )));
            }
            copied += got;
        }
        Ok(copied)
    }
}

fn written(entry: u64) -> bool {
    entry & SWAPPED != 0 || (entry & PRESENT != 0 && entry & FILE_OR_SHARED == 0)
}

/// Creates `path` (it must not exist) as a sparse file of `len` bytes, open to read and write
/// (to be mapped): a new RAM file, before [`copy_data`] fills it.
pub fn new_file(path: &Path, len: u64) -> io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)?;
    f.set_len(len)?;
    Ok(f)
}

/// The byte ranges of `f` up to `end` that hold data (its holes skipped), in order.
pub fn data_extents(f: &std::fs::File, end: u64) -> io::Result<Vec<Range<u64>>> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsRawFd;
    let end = end as i64;
    let mut out = Vec::new();
    let mut pos = 0i64;
    while pos < end {
        let data = match lseek(f.as_raw_fd(), pos, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(f.as_raw_fd(), data, Whence::SeekHole)?.min(end);
        if data < hole {
            out.push(data as u64..hole as u64);
        }
        pos = hole;
    }
    Ok(out)
}

/// Copies `from`'s data (its holes skipped) into the same places of the existing file `to`,
/// up to `len` bytes, in the kernel (`to` may be mapped and written by others meanwhile).
pub fn copy_data(from: &Path, to: &Path, len: u64) -> io::Result<()> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsRawFd;
    let src = std::fs::File::open(from)?;
    let dst = &std::fs::OpenOptions::new().write(true).open(to)?;
    let end = src.metadata()?.len().min(len);
    let mut in_kernel = true;
    for run in data_extents(&src, end)? {
        let (mut off_in, mut off_out) = (run.start as i64, run.start as i64);
        let hole = run.end as i64;
        while off_in < hole {
            let want = (hole - off_in) as usize;
            let n = if in_kernel {
                match nix::fcntl::copy_file_range(
                    &src,
                    Some(&mut off_in),
                    dst,
                    Some(&mut off_out),
                    want,
                ) {
                    Ok(n) => n,
                    // Between file systems (a RAM file in memory, see `fastram`).
                    Err(nix::errno::Errno::EXDEV) => {
                        in_kernel = false;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                // In the kernel still, through a pipe: written where `dst`'s offset is.
                lseek(dst.as_raw_fd(), off_out, Whence::SeekSet)?;
                let n = nix::sys::sendfile::sendfile64(dst, &src, Some(&mut off_in), want)?;
                off_out += n as i64;
                n
            };
            if n == 0 {
                return Err(io::Error::other(format!(
                    "{} ended while it was copied",
                    from.display()
                )));
            }
        }
    }
    Ok(())
}

/// Makes a sparse file of `len` bytes (all zeros, nothing allocated): RAM for a cold boot.
pub fn zero_file(path: &Path, len: u64) -> io::Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.set_len(len)
}

/// Allocates and maps, for writing, the pages of `dest` (a shared mapping of a RAM file) that
/// `runs` cover, without writing them (`MADV_POPULATE_WRITE`, Linux 5.14).
pub fn populate(dest: &memmap2::MmapMut, runs: &[Range<u64>]) -> std::io::Result<()> {
    for r in runs {
        let (start, end) = (r.start as usize, (r.end as usize).min(dest.len()));
        if start < end {
            dest.advise_range(memmap2::Advice::PopulateWrite, start, end - start)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// This process maps a file private and writes three pages (two adjacent) and swaps
    /// nothing: exactly those pages are found, and copying them over a copy of the file gives
    /// the memory as this process sees it.
    #[test]
    fn written_pages_are_found_and_copied() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let len = 64 * PAGE;
        let mut content = vec![0u8; len as usize];
        for (i, b) in content.iter_mut().enumerate() {
            *b = (i / PAGE as usize) as u8;
        }
        // A hole in the middle: pages 20..40 are zeros and unallocated.
        std::fs::write(&base, &content).unwrap();
        {
            let f = std::fs::OpenOptions::new().write(true).open(&base).unwrap();
            nix::fcntl::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                    | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                (20 * PAGE) as i64,
                (20 * PAGE) as i64,
            )
            .unwrap();
        }
        for b in &mut content[(20 * PAGE) as usize..(40 * PAGE) as usize] {
            *b = 0;
        }
        let file = std::fs::File::open(&base).unwrap();
        // SAFETY: a private mapping of a file this test owns and nobody else changes.
        let mut map = unsafe { memmap2::MmapOptions::new().map_copy(&file) }.unwrap();
        // Read everything once (present, file-backed), then write three pages.
        let sum: u64 = map.iter().map(|b| *b as u64).sum();
        assert!(sum > 0);
        for (page, value) in [(3u64, 0xaa), (4, 0xbb), (30, 0xcc)] {
            map[(page * PAGE) as usize + 7] = value;
            content[(page * PAGE) as usize + 7] = value;
        }
        let ram = GuestRam::find(std::process::id(), &base).unwrap();
        assert_eq!(ram.len(), len);
        let runs = ram.written().unwrap();
        assert_eq!(runs, vec![3 * PAGE..5 * PAGE, 30 * PAGE..31 * PAGE]);

        let copy = dir.path().join("copy");
        let out = new_file(&copy, len).unwrap();
        // SAFETY: a file of this test's own.
        let mut dest = unsafe { memmap2::MmapOptions::new().map_mut(&out) }.unwrap();
        // As a save does: the written pages allocated first, then the file's data, then the
        // written pages, straight into the shared mapping.
        populate(&dest, &runs).unwrap();
        assert!(crate::snapshot::allocated_bytes(&copy) >= 3 * PAGE);
        copy_data(&base, &copy, len).unwrap();
        assert!(
            crate::snapshot::allocated_bytes(&copy) < len,
            "the hole was not kept"
        );
        assert_eq!(ram.copy_into(&runs, &mut dest).unwrap(), 3 * PAGE);
        drop(dest);
        assert!(std::fs::read(&copy).unwrap() == content);
        assert!(ram
            .copy_into(std::slice::from_ref(&(0..len + PAGE)), &mut [0u8; 16])
            .is_err());
        drop(map);
    }

    /// Written pages scattered over a mapping, more runs than one scan's batch holds: the
    /// kernel's scan and the entry-by-entry reading find the same runs.
    #[test]
    fn the_page_map_scan_and_the_reading_agree() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let len = 4096 * PAGE;
        std::fs::write(&base, vec![7u8; len as usize]).unwrap();
        let file = std::fs::File::open(&base).unwrap();
        // SAFETY: a private mapping of a file this test owns and nobody else changes.
        let mut map = unsafe { memmap2::MmapOptions::new().map_copy(&file) }.unwrap();
        let sum: u64 = map.iter().step_by(PAGE as usize).map(|b| *b as u64).sum();
        assert_eq!(sum, 7 * 4096);
        // Every third page, and one run of 100.
        for page in (0..3000u64).step_by(3).chain(3500..3600) {
            map[(page * PAGE) as usize] = 1;
        }
        let ram = GuestRam::find(std::process::id(), &base).unwrap();
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let read = ram.written_by_reading(&pagemap).unwrap();
        assert_eq!(read.len(), 1001);
        assert_eq!(read.last(), Some(&(3500 * PAGE..3600 * PAGE)));
        match ram.written_by_scan(&pagemap, 64) {
            Ok(scanned) => assert_eq!(scanned, read),
            // A kernel before 6.7.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOTTY), "{e}"),
        }
        drop(map);
    }

    /// Enough written pages for two threads (one run of 24 MiB and scattered pages): the
    /// mapped copy is exact.
    #[test]
    fn a_large_copy_on_two_threads_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let len = 64u64 << 20;
        zero_file(&base, len).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&base)
            .unwrap();
        // SAFETY: a private mapping of a file this test owns and nobody else changes.
        let mut map = unsafe { memmap2::MmapOptions::new().map_copy(&file) }.unwrap();
        let mut want = vec![0u8; len as usize];
        for (i, b) in map[(8 << 20)..(32 << 20)].iter_mut().enumerate() {
            *b = (i % 253) as u8 + 1;
        }
        want[(8 << 20)..(32 << 20)].copy_from_slice(&map[(8 << 20)..(32 << 20)]);
        for page in (9000..16000u64).step_by(3) {
            let at = (page * PAGE) as usize;
            map[at] = 0x5a;
            want[at] = 0x5a;
        }
        let ram = GuestRam::find(std::process::id(), &base).unwrap();
        let runs = ram.written().unwrap();
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        assert_eq!(runs, ram.written_by_reading(&pagemap).unwrap());
        let copy = dir.path().join("copy");
        let out = new_file(&copy, len).unwrap();
        copy_data(&base, &copy, len).unwrap();
        // SAFETY: a file of this test's own.
        let mut dest = unsafe { memmap2::MmapOptions::new().map_mut(&out) }.unwrap();
        let n = ram.copy_into(&runs, &mut dest).unwrap();
        assert_eq!(n, (24 << 20) + 2334 * PAGE);
        drop(dest);
        assert!(std::fs::read(&copy).unwrap() == want);
        drop(map);
    }

    /// A copy into another file system (a RAM file in memory) has the same bytes and holes.
    #[test]
    fn a_copy_across_file_systems_keeps_data_and_holes() {
        let shm = std::path::Path::new("/dev/shm");
        let Ok(to_dir) = tempfile::tempdir_in(shm) else {
            return; // no /dev/shm on this host: nothing to cross to
        };
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        if std::fs::metadata(dir.path()).unwrap().dev() == std::fs::metadata(shm).unwrap().dev() {
            return;
        }
        let base = dir.path().join("base");
        let len = (16u64 << 20) + 64 * PAGE;
        zero_file(&base, len).unwrap();
        let data: Vec<u8> = (0..((8 << 20) + 5 * PAGE as usize))
            .map(|i| (i % 251) as u8)
            .collect();
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&base).unwrap();
            f.write_all_at(&data, 3 * PAGE).unwrap();
        }
        let copy = to_dir.path().join("mem");
        new_file(&copy, len).unwrap();
        copy_data(&base, &copy, len).unwrap();
        assert!(std::fs::read(&copy).unwrap() == std::fs::read(&base).unwrap());
        assert!(
            crate::snapshot::allocated_bytes(&copy) < len / 2,
            "the holes were filled"
        );
    }

    #[test]
    fn a_file_not_mapped_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ram");
        zero_file(&f, 16 * PAGE).unwrap();
        assert_eq!(crate::snapshot::allocated_bytes(&f), 0);
        let err = GuestRam::find(std::process::id(), &f).unwrap_err();
        assert!(err.to_string().contains("does not map"), "{err}");
        assert!(GuestRam::of_qemu(std::process::id()).is_err());
    }
}

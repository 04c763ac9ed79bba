//! The persister's side of the device: one file's slices written with `O_DIRECT` (or through
//! the page cache where the file system refuses it) and read back from the device to compare,
//! into buffers aligned for it; the pages a buffered write leaves dropped once on disk.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::os::background;

/// Bytes copied, or read back and compared, in one I/O (a burst of work between two looks at the
/// CPU throttle is several: [`super::pacer::LOOK_EVERY`]).
pub(super) const SLICE: usize = 4 << 20;

/// How the persister writes a file: with `O_DIRECT` (a second descriptor of the temporary
/// file beside the plain one), or through the page cache where the file system refuses it.
pub(super) enum Disk<'a> {
    Direct {
        direct: std::fs::File,
        file: &'a std::fs::File,
    },
    Buffered {
        file: &'a std::fs::File,
        /// The slice written before the last one (its writeback is waited for next).
        previous: Option<(u64, u64)>,
    },
}

/// What [`Disk::write`] did with a slice.
pub(super) enum Written {
    /// Written with `O_DIRECT` and read back from the device equal, but for its last `rest`
    /// bytes (less than a block, written through the page cache: read back after the fsync).
    Verified {
        /// Bytes at the end written through the page cache.
        rest: usize,
    },
    /// Read back from the device, it differs from byte `at` of the slice.
    Differs { at: u64 },
    /// Written through the page cache (read back after the fsync).
    Buffered,
}

impl<'a> Disk<'a> {
    pub(super) fn open(file: &'a std::fs::File, path: &Path, direct: bool) -> Self {
        let opened = direct
            .then(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .ok()
            })
            .flatten();
        match opened {
            Some(direct) => Disk::Direct { direct, file },
            None => Disk::Buffered {
                file,
                previous: None,
            },
        }
    }

    /// Writes `slice` at `at` (`scratch`, aligned and as long as the slice: where it is read
    /// back). A file system that opens with `O_DIRECT` but refuses its first write is written
    /// through the page cache.
    pub(super) fn write(
        &mut self,
        slice: &[u8],
        at: u64,
        scratch: &mut [u8],
    ) -> std::io::Result<Written> {
        if let Disk::Direct { direct, file } = self {
            let file: &'a std::fs::File = file;
            let blocks = slice.len() / ALIGN * ALIGN;
            let body = &slice[..blocks];
            match direct.write_all_at(body, at) {
                Err(e) if at == 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                    *self = Disk::Buffered {
                        file,
                        previous: None,
                    };
                }
                Err(e) => return Err(e),
                Ok(()) => {
                    let n = read_full_at(direct, &mut scratch[..blocks], at)?;
                    if let Some(i) = first_difference(body, &scratch[..n]) {
                        return Ok(Written::Differs { at: i as u64 });
                    }
                    file.write_all_at(&slice[blocks..], at + blocks as u64)?;
                    return Ok(Written::Verified {
                        rest: slice.len() - blocks,
                    });
                }
            }
        }
        let Disk::Buffered { file, previous } = self else {
            unreachable!("a direct write has returned or fallen back to the page cache")
        };
        file.write_all_at(slice, at)?;
        // This slice's writeback starts now; the one before is waited for and its pages
        // dropped: the disk works as the copy goes, and the page cache holds two slices at most.
        let n = slice.len() as u64;
        let _ = background::write_back(file, at, n, false);
        if let Some((p, len)) = *previous {
            if background::write_back(file, p, len, true).is_ok() {
                drop_pages(file, p, len);
            }
        }
        *previous = Some((at, n));
        Ok(Written::Buffered)
    }
}

/// Where `theirs` (what was read back) first differs from `ours`, or is short.
pub(super) fn first_difference(ours: &[u8], theirs: &[u8]) -> Option<usize> {
    if ours == theirs {
        return None;
    }
    Some(
        ours.iter()
            .zip(theirs)
            .position(|(a, b)| a != b)
            .unwrap_or(ours.len().min(theirs.len())),
    )
}

/// A buffer whose start is aligned to [`ALIGN`], for `O_DIRECT`.
pub(super) struct Aligned {
    raw: Vec<u8>,
    start: usize,
}

impl Aligned {
    pub(super) fn new(len: usize) -> Self {
        let raw = vec![0u8; len + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        Self { raw, start }
    }

    /// Its first `len` bytes (at most the length it was made with).
    pub(super) fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.raw[self.start..self.start + len]
    }
}

/// Drops `len` bytes of `file` from `offset` (0: to the end) from the page cache (written back
/// already): the persisted copy does not crowd the training's memory.
pub(super) fn drop_pages(file: &std::fs::File, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    let _ = nix::fcntl::posix_fadvise(
        file,
        offset,
        len,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

/// Block size multiple of an `O_DIRECT` transfer: its buffer's address, offset and length.
pub(super) const ALIGN: usize = 4096;

/// Reads the file's last bytes from `at` (a block boundary) with `direct` (an `O_DIRECT`
/// descriptor) into `scratch` (aligned, whole blocks, longer than `ours`) and compares them with
/// `ours`, the bytes written there: `Ok(Err(offset))` where they differ or the file does not
/// end with them.
pub(super) fn read_back_at(
    direct: &std::fs::File,
    at: u64,
    ours: &[u8],
    scratch: &mut [u8],
) -> std::io::Result<Result<(), u64>> {
    let n = read_full_at(direct, scratch, at)?;
    Ok(
        match first_difference(ours, &scratch[..n.min(ours.len())]) {
            Some(i) => Err(at + i as u64),
            None if n > ours.len() => Err(at + ours.len() as u64),
            None => Ok(()),
        },
    )
}

/// The `bytes` of `path` as the disk holds them, read with `O_DIRECT` (its pages dropped from
/// the cache first where the file system refuses that), compared with `staged`, `after_slice`
/// called with the bytes of each slice (the persister's pace):
/// `Ok(Err(offset))` at the first slice that differs or is short.
pub(super) fn read_back(
    path: &Path,
    bytes: u64,
    staged: &std::fs::File,
    mut after_slice: impl FnMut(usize),
) -> std::io::Result<Result<(), u64>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => f,
        Err(_) => {
            let f = std::fs::File::open(path)?;
            drop_pages(&f, 0, 0);
            f
        }
    };
    let mut disk = Aligned::new(SLICE);
    let mut theirs = vec![0u8; SLICE];
    let mut at = 0u64;
    while at < bytes {
        let want = usize::try_from(bytes - at).map_or(SLICE, |left| left.min(SLICE));
        let n = read_full_at(&file, disk.get(SLICE), at)?;
        if n < want {
            return Ok(Err(at + n as u64));
        }
        staged.read_exact_at(&mut theirs[..want], at)?;
        if *disk.get(want) != theirs[..want] {
            return Ok(Err(at));
        }
        at += want as u64;
        after_slice(want);
    }
    drop_pages(&file, 0, 0);
    Ok(Ok(()))
}

/// Reads from `at` until `buf` is full or the file ends (each read asks for the rest of `buf`:
/// whole blocks for `O_DIRECT` until the end); the bytes read.
pub(super) fn read_full_at(
    file: &std::fs::File,
    buf: &mut [u8],
    at: u64,
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_read_back_are_compared_with_the_staged_copy() {
        let d = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..2 * SLICE + 100).map(|i| (i % 251) as u8).collect();
        let disk = d.path().join("disk");
        std::fs::write(&disk, &bytes).unwrap();
        let mut other = bytes.clone();
        other[SLICE + 7] ^= 1;
        std::fs::write(d.path().join("same"), &bytes).unwrap();
        std::fs::write(d.path().join("other"), &other).unwrap();
        let open = |n: &str| std::fs::File::open(d.path().join(n)).unwrap();
        let n = bytes.len() as u64;
        assert_eq!(read_back(&disk, n, &open("same"), |_| {}).unwrap(), Ok(()));
        let other = read_back(&disk, n, &open("other"), |_| {}).unwrap();
        assert_eq!(other, Err(SLICE as u64), "the slice that differs");
        let longer = read_back(&disk, n + 1, &open("same"), |_| {}).unwrap();
        assert_eq!(longer, Err(n), "the disk holds less than written");
    }

    #[test]
    fn the_last_bytes_read_back_are_compared_where_they_differ() {
        let d = tempfile::tempdir().unwrap();
        let disk = d.path().join("disk");
        std::fs::write(&disk, [[5u8; ALIGN].as_slice(), b"tail"].concat()).unwrap();
        let file = std::fs::File::open(&disk).unwrap();
        let mut scratch = Aligned::new(ALIGN);
        let at = ALIGN as u64;
        let mut check = |ours: &[u8]| read_back_at(&file, at, ours, scratch.get(ALIGN)).unwrap();
        assert_eq!(check(b"tail"), Ok(()));
        assert_eq!(check(b"tall"), Err(at + 2));
        assert_eq!(check(b"tails"), Err(at + 4), "the disk holds less");
        assert_eq!(check(b"tai"), Err(at + 3), "the disk holds more");
        assert_eq!(first_difference(b"abc", b"abc"), None);
        assert_eq!(first_difference(b"abc", b"abd"), Some(2));
        assert_eq!(first_difference(b"abc", b"ab"), Some(2));
    }
}

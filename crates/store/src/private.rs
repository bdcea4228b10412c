//! Files and directories of a store are its owner's alone: a replica read straight off the
//! disk is a volume read without any access check. Directories are created 0700 and files
//! 0600, whatever the process's umask; a process also sets its umask to 077 at start
//! (`trireme`'s `main`), which covers what other crates create beside them.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Mode of a store's directories.
pub const DIR_MODE: u32 = 0o700;
/// Mode of a store's files.
pub const FILE_MODE: u32 = 0o600;

/// `create_dir_all`, with every directory it creates 0700.
pub fn create_dir_all(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

/// Options that create a file 0600 (for `OpenOptions::open`'s create flags).
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// `File::create`, 0600.
pub fn create(path: &Path) -> std::io::Result<File> {
    options().write(true).create(true).truncate(true).open(path)
}

/// `std::fs::write`, into a file that is 0600 if it is new.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    create(path)?.write_all(bytes)
}

//! Reading a process's memory: another process through process_vm_readv (the agent), or our
//! own (the in-process shim). Everything else reads through the [`Memory`] trait.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MemoryError {
    #[error("cannot read {len} bytes at {addr:#x} of pid {pid}: {reason}")]
    Unreadable { pid: u32, addr: u64, len: usize, reason: String },
    #[error("{what} at {addr:#x} is implausible")]
    Implausible { what: &'static str, addr: u64 },
}

pub trait Memory {
    /// Fills `buf` from `addr`, entirely or not at all.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError>;

    fn read_u64(&self, addr: u64) -> Result<u64, MemoryError> {
        let mut buf = [0u8; 8];
        self.read(addr, &mut buf)?;
        Ok(u64::from_ne_bytes(buf))
    }

    fn read_i32(&self, addr: u64) -> Result<i32, MemoryError> {
        let mut buf = [0u8; 4];
        self.read(addr, &mut buf)?;
        Ok(i32::from_ne_bytes(buf))
    }

    fn read_u32(&self, addr: u64) -> Result<u32, MemoryError> {
        let mut buf = [0u8; 4];
        self.read(addr, &mut buf)?;
        Ok(u32::from_ne_bytes(buf))
    }

    fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut buf = vec![0u8; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }
}

/// Another process, read with process_vm_readv (needs CAP_SYS_PTRACE or the same user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMemory {
    pub pid: u32,
}

impl Memory for RemoteMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: the local iovec covers `buf` exactly; the kernel checks the remote one.
        let n = unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n == buf.len() as isize {
            return Ok(());
        }
        let reason =
            if n < 0 { std::io::Error::last_os_error().to_string() } else { format!("short read of {n} bytes") };
        Err(MemoryError::Unreadable { pid: self.pid, addr, len: buf.len(), reason })
    }
}

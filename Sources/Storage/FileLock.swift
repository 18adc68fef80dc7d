import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive `flock` on `<database>.lock`, held for the life of a `Database`.
///
/// SQLite's own locks only serialize transactions; they do not stop two service processes from
/// both believing they own one database (both would run migrations and outbox delivery). The
/// kernel releases a `flock` when its process dies, even by SIGKILL, so a crash never leaves a
/// stale lock. The file holds the owner's pid, for the error message the loser prints.
final class FileLock: Sendable {
    let path: String
    private let descriptor: Mutex<Int32>

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = Mutex(descriptor)
    }

    static func acquire(path: String, databasePath: String) throws -> FileLock {
        // O_CLOEXEC: a child process must not inherit (and so keep alive) our lock.
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw StorageError.cannotOpen(path: databasePath, reason: "cannot create lock file \(path): \(String(cString: strerror(errno)))")
        }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let err = errno
            let holder = readHolder(fd)
            close(fd)
            if err == EWOULDBLOCK {
                throw StorageError.locked(path: databasePath, holder: holder)
            }
            throw StorageError.cannotOpen(path: databasePath, reason: "cannot lock \(path): \(String(cString: strerror(err)))")
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = pid.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        return FileLock(path: path, descriptor: fd)
    }

    private static func readHolder(_ fd: Int32) -> String? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard n > 0 else { return nil }
        let text = String(decoding: buffer[0..<n], as: UTF8.self).trimmingWhitespace
        return text.isEmpty ? nil : text
    }

    /// Releases the lock (idempotent). The file stays: deleting it would race with a new owner.
    func release() {
        descriptor.withLock { fd in
            guard fd >= 0 else { return }
            // Unlock explicitly: a child being spawned by another thread holds a copy of the
            // descriptor until its exec closes it, and a plain close would leave the lock held
            // until then (a reopen in this process could fail as "in use").
            flock(fd, LOCK_UN)
            close(fd)
            fd = -1
        }
    }

    deinit { release() }
}

extension String {
    var trimmingWhitespace: String {
        var s = Substring(self)
        while let f = s.first, f.isWhitespace { s.removeFirst() }
        while let l = s.last, l.isWhitespace { s.removeLast() }
        return String(s)
    }
}

import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs a child process with its standard streams connected to files, through `posix_spawn`.
///
/// Not `Foundation.Process`: on Linux, `Process.run()` called from several threads at once can
/// crash the whole test process (SIGSEGV inside swift-corelibs-foundation; see its issues 4772,
/// 4795, 4810). Contract and codec tests start hundreds of short `protoc` runs from concurrent
/// suites, so they go through here instead.
public enum Subprocess {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Starts `executable` with `arguments`; stdin reads `stdinPath`, stdout and stderr are
    /// written (created or truncated) to `stdoutPath` and `stderrPath`. Returns the pid.
    public static func spawn(_ executable: String, _ arguments: [String], stdinPath: String, stdoutPath: String, stderrPath: String) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdinPath, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdoutPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for arg in argv { free(arg) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, environ)
        guard rc == 0 else {
            throw Failure(description: "cannot run \(executable): \(String(cString: strerror(rc)))")
        }
        return pid
    }

    /// Waits for `pid` (blocking this thread) and returns its exit status, or 128 + the signal
    /// that killed it.
    public static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            if errno != EINTR { return -1 }
        }
        let signal = status & 0x7f
        return signal == 0 ? (status >> 8) & 0xff : 128 + signal
    }

    /// Runs to completion, blocking the calling thread.
    public static func run(_ executable: String, _ arguments: [String], stdinPath: String, stdoutPath: String, stderrPath: String) throws -> Int32 {
        wait(try spawn(executable, arguments, stdinPath: stdinPath, stdoutPath: stdoutPath, stderrPath: stderrPath))
    }

    /// Runs to completion; the wait happens on a Dispatch thread, not the cooperative pool.
    public static func run(
        _ executable: String, _ arguments: [String], stdinPath: String, stdoutPath: String, stderrPath: String
    ) async throws -> Int32 {
        let pid = try spawn(executable, arguments, stdinPath: stdinPath, stdoutPath: stdoutPath, stderrPath: stderrPath)
        return await withCheckedContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(returning: wait(pid)) }
        }
    }

    /// Runs with `input` on stdin; returns stdout and stderr. Streams go through files in a
    /// private temporary directory, so no pipe can fill up and block either side.
    public static func capture(
        _ executable: String, _ arguments: [String], input: [UInt8]
    ) async throws -> (status: Int32, stdout: [UInt8], stderr: [UInt8]) {
        let files = try Files(input: input)
        defer { files.remove() }
        let status = try await run(executable, arguments, stdinPath: files.input, stdoutPath: files.output, stderrPath: files.error)
        return (status, files.read(files.output), files.read(files.error))
    }

    /// Blocking form of `capture`.
    public static func captureSync(
        _ executable: String, _ arguments: [String], input: [UInt8]
    ) throws -> (status: Int32, stdout: [UInt8], stderr: [UInt8]) {
        let files = try Files(input: input)
        defer { files.remove() }
        let status = try run(executable, arguments, stdinPath: files.input, stdoutPath: files.output, stderrPath: files.error)
        return (status, files.read(files.output), files.read(files.error))
    }

    private struct Files {
        let directory: String
        var input: String { directory + "/in" }
        var output: String { directory + "/out" }
        var error: String { directory + "/err" }

        init(input bytes: [UInt8]) throws {
            var template = Array((NSTemporaryDirectory() + "/subprocess-XXXXXX").utf8CString)
            guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
                throw Failure(description: "mkdtemp failed: \(String(cString: strerror(errno)))")
            }
            directory = String(cString: made)
            try Data(bytes).write(to: URL(fileURLWithPath: directory + "/in"))
        }

        func read(_ path: String) -> [UInt8] { Array((try? Data(contentsOf: URL(fileURLWithPath: path))) ?? Data()) }

        func remove() { try? FileManager.default.removeItem(atPath: directory) }
    }
}

import Foundation

/// The reference implementation: Google's `protoc` turns fixtures (text format) into wire bytes
/// and back. Contract tests compare our codec against it, and the harness uses its canonical
/// text output to compare responses.
public struct Protoc: Sendable {
    public var executable: String
    /// `-I` paths: `Proto/` and the well-known types (`/usr/include`, libprotobuf-dev).
    public var includePaths: [String]

    public init(executable: String = "/usr/bin/protoc", paths: ContractPaths = .locate(), wellKnownTypes: String = "/usr/include") {
        self.executable = executable
        self.includePaths = [paths.protoDirectory, wellKnownTypes]
    }

    /// `protoc --encode=<messageName> <files>`: text format → wire bytes.
    public func encode(_ messageName: String, text: String, files: [String]) async throws -> [UInt8] {
        try await run(["--encode=\(messageName)"] + files, input: Array(text.utf8))
    }

    /// `protoc --decode=<messageName> <files>`: wire bytes → canonical text format (fields in
    /// number order, map entries sorted by key, two-space indentation).
    public func decode(_ messageName: String, bytes: [UInt8], files: [String]) async throws -> String {
        String(decoding: try await run(["--decode=\(messageName)"] + files, input: bytes), as: UTF8.self)
    }

    /// `protoc --decode_raw`: wire bytes → field numbers and values, for failure messages.
    public func decodeRaw(_ bytes: [UInt8]) async throws -> String {
        String(decoding: try await run(["--decode_raw"], input: bytes), as: UTF8.self)
    }

    /// Runs protoc with stdin from `input`; returns stdout, throws with stderr on a non-zero exit.
    /// Standard streams go through temporary files so no pipe can fill up and block either side.
    public func run(_ arguments: [String], input: [UInt8]) async throws -> [UInt8] {
        let fm = FileManager.default
        let dir = fm.temporaryDirectory.appendingPathComponent("protoc-\(UUID().uuidString)")
        try fm.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? fm.removeItem(at: dir) }
        let inURL = dir.appendingPathComponent("in"), outURL = dir.appendingPathComponent("out")
        let errURL = dir.appendingPathComponent("err")
        try Data(input).write(to: inURL)
        _ = fm.createFile(atPath: outURL.path, contents: nil)
        _ = fm.createFile(atPath: errURL.path, contents: nil)
        let stdin = try FileHandle(forReadingFrom: inURL)
        let stdout = try FileHandle(forWritingTo: outURL)
        let stderr = try FileHandle(forWritingTo: errURL)
        defer { try? stdin.close(); try? stdout.close(); try? stderr.close() }

        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = includePaths.map { "-I" + $0 } + arguments
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        let status: Int32 = try await withCheckedThrowingContinuation { continuation in
            process.terminationHandler = { p in continuation.resume(returning: p.terminationStatus) }
            do { try process.run() } catch {
                process.terminationHandler = nil
                continuation.resume(throwing: ContractError("cannot run \(executable): \(error)"))
            }
        }
        if status != 0 {
            let err = String(decoding: (try? Data(contentsOf: errURL)) ?? Data(), as: UTF8.self)
            throw ContractError("protoc \(arguments.joined(separator: " ")) failed (exit \(status)):\n\(err)")
        }
        return Array(try Data(contentsOf: outURL))
    }
}

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
    public func run(_ arguments: [String], input: [UInt8]) async throws -> [UInt8] {
        let result: (status: Int32, stdout: [UInt8], stderr: [UInt8])
        do {
            result = try await Subprocess.capture(executable, includePaths.map { "-I" + $0 } + arguments, input: input)
        } catch {
            throw ContractError("cannot run \(executable): \(error)")
        }
        guard result.status == 0 else {
            throw ContractError(
                "protoc \(arguments.joined(separator: " ")) failed (exit \(result.status)):\n\(String(decoding: result.stderr, as: UTF8.self))")
        }
        return result.stdout
    }
}

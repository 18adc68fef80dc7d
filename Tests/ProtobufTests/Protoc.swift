import ContractTesting
import Foundation

/// Runs the system `protoc` (the C++ reference implementation) to produce and read wire bytes,
/// so the tests compare our protobuf-c-backed encoding with protobuf's own.
enum Protoc {
    static let root: URL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    static let includes = [
        root.appendingPathComponent("Tests/ProtobufTests/Proto").path,
        root.appendingPathComponent("Proto").path,
        "/usr/include",
        "/usr/share/grpc-proto",
    ]
    static let codecTestProto = "codectest/v1/codec_test.proto"

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    static func run(_ arguments: [String], stdin: [UInt8]) throws -> [UInt8] {
        // posix_spawn, not Foundation.Process: concurrent Process.run() can crash on Linux.
        let result = try Subprocess.captureSync("/usr/bin/protoc", includes.map { "-I" + $0 } + arguments, input: stdin)
        guard result.status == 0 else {
            throw Failure(description: "protoc \(arguments.joined(separator: " ")): \(String(decoding: result.stderr, as: UTF8.self))")
        }
        return result.stdout
    }

    /// `protoc --encode`: text format → wire bytes.
    static func encode(_ type: String, _ text: String, file: String = codecTestProto) throws -> [UInt8] {
        try run(["--encode=\(type)", file], stdin: Array(text.utf8))
    }

    /// `protoc --decode`: wire bytes → canonical text format (map entries sorted by key), which
    /// compares encodings that differ only in field or map-entry order.
    static func decode(_ type: String, _ bytes: [UInt8], file: String = codecTestProto) throws -> String {
        String(decoding: try run(["--decode=\(type)", file], stdin: bytes), as: UTF8.self)
    }
}

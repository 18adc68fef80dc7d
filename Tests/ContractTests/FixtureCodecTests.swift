import ContractTesting
import Contracts
import Foundation
import RPCCore
import Testing

/// Wire compatibility with the reference implementation: every fixture, encoded by Google's
/// protoc, must decode with our generated type and re-encode to exactly the same bytes, and our
/// bytes must decode to an equal value. One test per service, one case per fixture.
@Suite struct FixtureCodecTests {
    static let paths = ContractPaths.locate()
    static func fixtures(_ service: String) -> [String] { (try? paths.fixtureNames(service: service)) ?? [] }

    @Test("accounts fixtures: protoc's bytes through our codec", arguments: fixtures("accounts"))
    func accounts(_ file: String) async throws { try await Self.check("accounts", file) }

    @Test("finance fixtures: protoc's bytes through our codec", arguments: fixtures("finance"))
    func finance(_ file: String) async throws { try await Self.check("finance", file) }

    @Test("matchmaking fixtures: protoc's bytes through our codec", arguments: fixtures("matchmaking"))
    func matchmaking(_ file: String) async throws { try await Self.check("matchmaking", file) }

    @Test("social fixtures: protoc's bytes through our codec", arguments: fixtures("social"))
    func social(_ file: String) async throws { try await Self.check("social", file) }

    @Test("tasks fixtures: protoc's bytes through our codec", arguments: fixtures("tasks"))
    func tasks(_ file: String) async throws { try await Self.check("tasks", file) }

    static func check(_ service: String, _ file: String) async throws {
        let fixture = try ContractFixture.load(service: service, fileName: file, paths: paths)
        let catalog = try #require(ContractCatalog.service(service), "no catalog entry for \(service)")
        let type = try #require(
            catalog.messageTypes[fixture.messageName],
            "\(fixture): no RPC of \(service) takes or returns \(fixture.messageName)")
        let protoc = Protoc(paths: paths)
        let reference = try await protoc.encode(fixture.messageName, text: fixture.text, files: paths.protoFiles(service: service))

        let outcome = roundTrip(type, reference)
        switch outcome {
        case .rejected(let error):
            Issue.record(
                "\(fixture): our \(fixture.messageName) decoder rejects protoc's \(reference.count) bytes (\(error)):\n\(HexDiff.dump(reference))")
        case .reencoded(let ours, let stable):
            if ours != reference {
                let rawReference = (try? await protoc.decodeRaw(reference)) ?? "(protoc --decode_raw failed)"
                let rawOurs = (try? await protoc.decodeRaw(ours)) ?? "(protoc --decode_raw failed)"
                Issue.record(
                    """
                    \(fixture): our encoding of \(fixture.messageName) differs from protoc's
                    \(HexDiff.describe(reference: reference, ours: ours))
                    protoc --decode_raw of protoc's bytes:
                    \(rawReference)
                    protoc --decode_raw of ours:
                    \(rawOurs)
                    """)
            }
            if !stable {
                Issue.record("\(fixture): decoding our own bytes gives a value different from decoding protoc's")
            }
        }
    }

    enum Outcome {
        case rejected(any Error)
        /// Our bytes, and whether decoding them gave a value equal to the first decode.
        case reencoded([UInt8], stable: Bool)
    }

    static func roundTrip<M: ProtoMessage>(_: M.Type, _ bytes: [UInt8]) -> Outcome {
        let first: M
        do { first = try M(serializedBytes: bytes) } catch { return .rejected(error) }
        let ours = first.serializedBytes()
        guard let second = try? M(serializedBytes: ours) else { return .reencoded(ours, stable: false) }
        return .reencoded(ours, stable: second == first)
    }
}

/// Hex dumps for failure messages: rows of 16 bytes, `*` on rows that differ.
enum HexDiff {
    static func row(_ bytes: [UInt8], _ start: Int) -> String {
        guard start < bytes.count else { return "" }
        return bytes[start..<min(start + 16, bytes.count)].map { hex($0) }.joined(separator: " ")
    }
    static func hex(_ b: UInt8) -> String { String(b, radix: 16).count == 1 ? "0" + String(b, radix: 16) : String(b, radix: 16) }
    static func offset(_ i: Int) -> String { let s = String(i, radix: 16); return String(repeating: "0", count: max(0, 6 - s.count)) + s }

    static func dump(_ bytes: [UInt8]) -> String {
        stride(from: 0, to: max(bytes.count, 1), by: 16).map { "\(offset($0))  \(row(bytes, $0))" }.joined(separator: "\n")
    }

    static func describe(reference: [UInt8], ours: [UInt8]) -> String {
        let common = min(reference.count, ours.count)
        let first = (0..<common).first { reference[$0] != ours[$0] } ?? common
        var lines = [
            "protoc \(reference.count) bytes, ours \(ours.count) bytes; first difference at byte \(first) (0x\(String(first, radix: 16)))",
            "offset  protoc | ours",
        ]
        let rows = stride(from: 0, to: max(reference.count, ours.count), by: 16)
        // Keep the dump readable for big messages: rows near the first difference only.
        for start in rows where reference.count + ours.count <= 1024 || abs(start - first) <= 128 {
            let a = row(reference, start), b = row(ours, start)
            lines.append("\(a == b ? " " : "*")\(offset(start))  \(a.padding(toLength: 47, withPad: " ", startingAt: 0)) | \(b)")
        }
        return lines.joined(separator: "\n")
    }
}

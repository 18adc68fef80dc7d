import Foundation
import Logging
import Observability
import RPCCore
import Testing

@testable import ServiceKit

/// A temporary file a `LogOutput` writes to, read back as lines.
final class TemporaryLog: @unchecked Sendable {
    let path: String
    let output: LogOutput

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("log-\(UUID().uuidString).jsonl").path
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SettingsError("cannot create \(path)") }
        output = LogOutput(fileDescriptor: fd)
    }

    deinit {
        close(output.fileDescriptor)
        unlink(path)
    }

    func logger(_ label: String = "accounts", level: Logger.Level = .trace, provider: Logger.MetadataProvider? = nil) -> Logger {
        let output = self.output
        return Logger(label: label) { JSONLogHandler(label: $0, level: level, output: output, metadataProvider: provider) }
    }

    var bytes: [UInt8] { (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))) ?? [] }

    /// The lines written (each ended by a newline; the text after the last one would be a torn line).
    func lines() throws -> [String] {
        let text = String(decoding: bytes, as: UTF8.self)
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines.last == "", "the output ends with a newline")
        lines.removeLast()
        return lines
    }

    func objects() throws -> [[String: Any]] { try lines().map(jsonObject) }
}

/// One line parsed by Foundation's JSONSerialization, as an object.
func jsonObject(_ line: String) throws -> [String: Any] {
    let value = try JSONSerialization.jsonObject(with: Data(line.utf8))
    return try #require(value as? [String: Any], "not a JSON object: \(line)")
}

enum TestTrace {
    @TaskLocal static var ids: (trace: String, span: String)?
}

@Suite struct JSONLogHandlerTests {
    @Test func aLineIsOneJSONObjectWithTheFixedFieldsFirst() throws {
        let log = try TemporaryLog()
        log.logger().info("accounts listening on 127.0.0.1:9101 (data: /tmp/a)", metadata: ["rpc.code": "OK", "count": "\(3)"])
        let lines = try log.lines()
        #expect(lines.count == 1)
        let line = try #require(lines.first)
        #expect(line.hasPrefix(#"{"ts":""#))
        let o = try jsonObject(line)
        #expect(o["level"] as? String == "info")
        #expect(o["logger"] as? String == "accounts")
        #expect(o["msg"] as? String == "accounts listening on 127.0.0.1:9101 (data: /tmp/a)")
        #expect(o["rpc.code"] as? String == "OK")
        #expect(o["count"] as? String == "3")
        #expect(o["source"] as? String == "ServiceKitTests")
        #expect(Set(o.keys) == ["ts", "level", "logger", "msg", "rpc.code", "count", "source"])
        let ts = try #require(o["ts"] as? String)
        #expect(ts.range(of: #"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"#, options: .regularExpression) != nil, "\(ts)")
        // The order: ts, level, logger, msg, metadata (sorted), source.
        let order = ["\"ts\"", "\"level\"", "\"logger\"", "\"msg\"", "\"count\"", "\"rpc.code\"", "\"source\""].map {
            line.range(of: $0)!.lowerBound
        }
        #expect(order == order.sorted())
        // What the process tests look for in the text still matches inside msg.
        #expect(line.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) != nil)
    }

    @Test func timestampsAreUTCWithMicroseconds() {
        #expect(LogTimestamp(seconds: 1_795_514_400, microseconds: 123_456).text == "2026-11-24T10:00:00.123456Z")
        #expect(LogTimestamp(seconds: 951_868_799, microseconds: 5).text == "2000-02-29T23:59:59.000005Z")
        #expect(LogTimestamp(seconds: 0, microseconds: 0).text == "1970-01-01T00:00:00.000000Z")
        let now = LogTimestamp.now()
        let year = Calendar(identifier: .gregorian).dateComponents(in: TimeZone(identifier: "UTC")!, from: Date()).year!
        #expect(now.text.hasPrefix("\(year)-") && now.microseconds < 1_000_000)
    }

    @Test func everyStringIsEscaped() throws {
        let invalidUTF8 = String(decoding: [0x61, 0xFF, 0xFE, 0xC3, 0x28, 0xED, 0xA0, 0x80, 0x62] as [UInt8], as: UTF8.self)
        #expect(invalidUTF8.unicodeScalars.contains("\u{FFFD}"))
        let nasty = [
            #"quote " backslash \ slash / \u0041 \n"#,
            "line\nbreak\r\n\ttab \u{08} \u{0C}",
            "nul \u{0000} bell \u{07} escape \u{1B}[31m red \u{7F} del \u{1F}",
            "emoji 🧑‍🚀 👍🏽 é 漢字 \u{FEFF}bom",
            "separators \u{2028} \u{2029}, C1 controls \u{85} \u{9B}31m",
            invalidUTF8,
            "{\"ts\":\"forged\"}\n{\"level\":\"critical\"}",
            "",
        ]
        let log = try TemporaryLog()
        for s in nasty {
            log.logger("label \"\n\(s)").warning("\(s)", metadata: ["value": "\(s)", "key \(s)": "k", "list": ["\(s)"]])
        }
        let bytes = log.bytes
        // One line per call, and no raw control character anywhere but the line ends.
        #expect(bytes.filter { $0 == 0x0A }.count == nasty.count)
        #expect(!bytes.contains { $0 < 0x20 && $0 != 0x0A || $0 == 0x7F })
        #expect(
            !String(decoding: bytes, as: UTF8.self).unicodeScalars.contains {
                (0x80...0x9F).contains($0.value) || $0 == "\u{2028}" || $0 == "\u{2029}"
            })
        let objects = try log.objects()
        #expect(objects.count == nasty.count)
        for (s, o) in zip(nasty, objects) {
            #expect(o["msg"] as? String == s, "\(s.debugDescription)")
            #expect(o["value"] as? String == s)
            #expect(o["key \(s)"] as? String == "k")
            #expect(o["list"] as? [String] == [s])
            #expect(o["logger"] as? String == "label \"\n\(s)")
            #expect(o["level"] as? String == "warning")
        }
        #expect((objects[5]["msg"] as? String)?.contains("\u{FFFD}") == true)
    }

    @Test func metadataNestsAsObjectsAndArrays() throws {
        let log = try TemporaryLog()
        var logger = log.logger()
        logger[metadataKey: "service"] = "accounts"
        logger.notice(
            "nested",
            metadata: [
                "call": ["method": "accounts.v1.Accounts/LogIn", "attempts": ["1", "2", ["deep": "x"]], "empty": [:]],
                "ids": [], "number": .stringConvertible(42),
            ])
        let o = try #require(try log.objects().first)
        #expect(o["service"] as? String == "accounts")
        #expect(o["number"] as? String == "42")
        #expect((o["ids"] as? [Any])?.isEmpty == true)
        let call = try #require(o["call"] as? [String: Any])
        #expect(call["method"] as? String == "accounts.v1.Accounts/LogIn")
        #expect((call["empty"] as? [String: Any])?.isEmpty == true)
        let attempts = try #require(call["attempts"] as? [Any])
        #expect(attempts.count == 3 && attempts[0] as? String == "1")
        #expect((attempts[2] as? [String: Any])?["deep"] as? String == "x")
    }

    /// The tracing's metadata provider reads the task-local span: its ids come out right after
    /// `msg`, as strings, whichever way they were given.
    @Test func traceAndSpanIDsFromTheMetadataProviderAreTopLevel() async throws {
        let provider = Logger.MetadataProvider {
            guard let ids = TestTrace.ids else { return [:] }
            return ["trace_id": .string(ids.trace), "span_id": .stringConvertible(ids.span)]
        }
        let log = try TemporaryLog()
        let logger = log.logger(provider: provider)
        logger.info("outside a span", metadata: ["z": "1"])
        TestTrace.$ids.withValue(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")) {
            logger.info("inside a span", metadata: ["a": "1"])
            logger.info("call metadata wins", metadata: ["span_id": "call-span"])
        }
        let lines = try log.lines()
        let objects = try lines.map(jsonObject)
        #expect(objects[0]["trace_id"] == nil && objects[0]["span_id"] == nil)
        #expect(objects[1]["trace_id"] as? String == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(objects[1]["span_id"] as? String == "00f067aa0ba902b7")
        #expect(objects[2]["span_id"] as? String == "call-span")
        let line = lines[1]
        let msg = line.range(of: #""msg""#)!.lowerBound, trace = line.range(of: #""trace_id""#)!.lowerBound
        let span = line.range(of: #""span_id""#)!.lowerBound, a = line.range(of: #""a""#)!.lowerBound
        #expect(msg < trace && trace < span && span < a)
    }

    @Test func fixedFieldsAreNeverReplacedByMetadata() throws {
        let log = try TemporaryLog()
        log.logger().info(
            "real", metadata: ["msg": "forged", "level": "critical", "ts": "0", "logger": "other", "source": "x", "metadata.level": "kept"])
        let line = try #require(try log.lines().first)
        let o = try jsonObject(line)
        #expect(o["msg"] as? String == "real" && o["level"] as? String == "info" && o["logger"] as? String == "accounts")
        #expect(o["source"] as? String == "ServiceKitTests")
        #expect(o["metadata.msg"] as? String == "forged" && o["metadata.ts"] as? String == "0")
        #expect(o["metadata.level"] as? String == "kept" && o["metadata.metadata.level"] as? String == "critical")
        // JSONSerialization keeps one of duplicated keys silently: count them in the text.
        for key in ["\"msg\":", "\"level\":", "\"ts\":", "\"logger\":", "\"source\":"] {
            #expect(line.components(separatedBy: key).count == 2, "\(key) appears once")
        }
    }

    struct Refused: Error, CustomStringConvertible {
        var description: String { "disk \"full\"\n" }
    }

    @Test func anErrorBecomesFields() throws {
        let log = try TemporaryLog()
        log.logger().error("write failed", error: Refused())
        let o = try #require(try log.objects().first)
        #expect(o["error.message"] as? String == "disk \"full\"\n")
        #expect((o["error.type"] as? String)?.hasSuffix("Refused") == true)
    }

    @Test func levelsBelowTheHandlersAreNotWritten() throws {
        let log = try TemporaryLog()
        let logger = log.logger(level: .warning)
        logger.trace("t")
        logger.debug("d")
        logger.info("i")
        logger.notice("n")
        logger.warning("w")
        logger.error("e")
        logger.critical("c")
        #expect(try log.objects().map { $0["level"] as? String } == ["warning", "error", "critical"])
        #expect(try log.objects().map { $0["msg"] as? String } == ["w", "e", "c"])
    }

    /// Lines longer than a pipe's atomic write, from many tasks at once through separate
    /// handlers on one output: every line whole, none lost.
    @Test func manyTasksWriteWholeLines() async throws {
        let log = try TemporaryLog()
        let tasks = 16, perTask = 150
        let padding = String(repeating: "x", count: 6000)
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<tasks {
                let logger = log.logger("task-\(t)")
                group.addTask {
                    for i in 0..<perTask { logger.info("\(padding)", metadata: ["task": "\(t)", "i": "\(i)"]) }
                }
            }
        }
        let objects = try log.objects()
        #expect(objects.count == tasks * perTask)
        var seen = Set<String>()
        for o in objects {
            #expect(o["msg"] as? String == padding)
            let t = try #require(o["task"] as? String), i = try #require(o["i"] as? String)
            #expect(o["logger"] as? String == "task-\(t)")
            seen.insert("\(t)/\(i)")
        }
        #expect(seen.count == tasks * perTask)
    }

    /// Lines to a pipe, read by another thread while they are written.
    @Test func linesThroughAPipeStayWhole() async throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        let output = LogOutput(fileDescriptor: writeEnd)
        let reader = Task.detached { () -> [UInt8] in
            var all: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = read(readEnd, &buffer, buffer.count)
                if n <= 0 { break }
                all += buffer[0..<n]
            }
            return all
        }
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<8 {
                group.addTask {
                    let logger = Logger(label: "pipe") { JSONLogHandler(label: $0, output: output, metadataProvider: nil) }
                    for i in 0..<100 { logger.info("\(String(repeating: "y", count: 100 * (i % 90)))", metadata: ["t": "\(t)"]) }
                }
            }
        }
        close(writeEnd)
        let text = String(decoding: await reader.value, as: UTF8.self)
        close(readEnd)
        let lines = text.split(separator: "\n")
        #expect(lines.count == 800)
        for line in lines { #expect(throws: Never.self) { try jsonObject(String(line)) } }
    }

    /// A line cut short (a non-blocking pipe nobody reads stays full for the write's second) is
    /// ended before the next line, which then starts a line of its own.
    @Test func aLineCutShortIsEndedBeforeTheNext() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        defer { close(readEnd) }
        _ = fcntl(writeEnd, F_SETFL, fcntl(writeEnd, F_GETFL) | O_NONBLOCK)
        let output = LogOutput(fileDescriptor: writeEnd)
        // Larger than the pipe holds: written in part, then given up after a second.
        output.write(Array(String(repeating: "x", count: 200_000).utf8) + [UInt8(ascii: "\n")])
        var got: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        _ = fcntl(readEnd, F_SETFL, fcntl(readEnd, F_GETFL) | O_NONBLOCK)
        while true {
            let n = read(readEnd, &buffer, buffer.count)
            if n <= 0 { break }
            got += buffer[0..<n]
        }
        #expect(!got.isEmpty && got.count < 200_001 && !got.contains(UInt8(ascii: "\n")))
        output.write(Array("{\"msg\":\"next\"}\n".utf8))
        close(writeEnd)
        while true {
            let n = read(readEnd, &buffer, buffer.count)
            if n <= 0 { break }
            got += buffer[0..<n]
        }
        let lines = String(decoding: got, as: UTF8.self).split(separator: "\n")
        #expect(lines.count == 2)
        #expect(lines.last == "{\"msg\":\"next\"}")
    }
}

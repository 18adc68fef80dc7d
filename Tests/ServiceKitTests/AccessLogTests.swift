import Foundation
import Logging
import RPCCore
import Testing

@testable import ServiceKit

@Suite struct AccessLogTests {
    static let user = CallerIdentity(userID: "01JD0USER", sessionID: "01JD0SESSION-secret", isGuest: false, expiresAt: 0)

    @Test func aLineNamesMethodCodeDurationPeerAndUser() throws {
        let log = try TemporaryLog()
        let access = AccessLog(logger: log.logger(AccessLog.label))
        access.line(
            method: "/accounts.v1.Accounts/GetProfile", code: .ok, duration: .microseconds(1234), peer: "10.0.0.7", user: Self.user)
        let method = MethodDescriptor(service: "accounts.v1.Accounts", method: "LogIn", kind: .unary)
        access.line(method: method, code: .notFound, duration: .milliseconds(12), peer: "[::1]", user: nil)
        let lines = try log.lines()
        let first = try jsonObject(lines[0]), second = try jsonObject(lines[1])
        #expect(first["logger"] as? String == "access" && first["level"] as? String == "info")
        #expect(first["msg"] as? String == "accounts.v1.Accounts/GetProfile OK 1.234ms")
        #expect(first["rpc.method"] as? String == "accounts.v1.Accounts/GetProfile")
        #expect(first["rpc.code"] as? String == "OK")
        #expect(first["duration_ms"] as? String == "1.234")
        #expect(first["peer"] as? String == "10.0.0.7")
        #expect(first["user"] as? String == "01JD0USER")
        #expect(Set(first.keys) == ["ts", "level", "logger", "msg", "rpc.method", "rpc.code", "duration_ms", "peer", "user", "source"])
        // The session id is never written; an unauthenticated call has no user field.
        #expect(!lines[0].contains("SESSION"))
        #expect(second["msg"] as? String == "accounts.v1.Accounts/LogIn NOT_FOUND 12.000ms")
        #expect(second["rpc.code"] as? String == "NOT_FOUND" && second["peer"] as? String == "[::1]")
        #expect(second["user"] == nil)
    }

    @Test func everyStatusIsNamed() {
        for code in StatusCode.allCases {
            let entry = AccessLog.entry(method: "a.B/C", code: code, duration: .zero, peer: "p", user: nil)
            #expect(entry.message == "a.B/C \(code.name) 0.000ms")
            #expect(entry.metadata["rpc.code"] == .string(code.name))
            #expect(entry.metadata["user"] == nil)
        }
    }

    @Test func durationsHaveThreeDecimals() {
        #expect(AccessLog.milliseconds(.zero) == "0.000")
        #expect(AccessLog.milliseconds(.nanoseconds(400)) == "0.000")
        #expect(AccessLog.milliseconds(.nanoseconds(500)) == "0.001")
        #expect(AccessLog.milliseconds(.nanoseconds(1_234_567)) == "1.235")
        #expect(AccessLog.milliseconds(.microseconds(50)) == "0.050")
        #expect(AccessLog.milliseconds(.seconds(12) + .microseconds(500)) == "12000.500")
        #expect(AccessLog.milliseconds(.seconds(-1)) == "0.000")
    }

    @Test func aMadeUpPathIsCut() {
        let long = "/" + String(repeating: "a", count: 5000)
        let entry = AccessLog.entry(method: long, code: .unimplemented, duration: .zero, peer: "p", user: nil)
        guard case .string(let method)? = entry.metadata["rpc.method"] else { Issue.record("no method"); return }
        #expect(method.count == AccessLog.maxFieldLength && method.hasSuffix("…"))
        #expect(entry.message.hasPrefix(method + " UNIMPLEMENTED"))
    }

    @Test func accessLogSettingTurnsItOff() throws {
        func settings(_ env: [String: String]) throws -> ServiceSettings {
            try ServiceSettings(
                name: "social", options: try ServiceOptions.parse([]), environment: env.merging(["ALLOW_DEV_CREDENTIALS": "1"]) { a, _ in a })
        }
        #expect(try settings([:]).accessLog)
        #expect(AccessLog(settings: try settings([:])) != nil)
        #expect(try settings(["ACCESS_LOG": "on"]).accessLog)
        #expect(try !settings(["ACCESS_LOG": "off"]).accessLog)
        #expect(try !settings(["ACCESS_LOG": "OFF"]).accessLog)
        #expect(AccessLog(settings: try settings(["ACCESS_LOG": "off"])) == nil)
        #expect { try settings(["ACCESS_LOG": "maybe"]) } throws: { "\($0)" == "ACCESS_LOG must be on or off, got 'maybe'" }
    }
}

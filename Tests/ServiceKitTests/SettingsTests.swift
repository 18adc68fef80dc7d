import ArgumentParser
import Foundation
import Storage
import Testing

@testable import ServiceKit

@Suite struct SettingsTests {
    @Test func keysReadTheirEnvironmentVariablesStrictly() throws {
        let s = Settings(environment: [
            "ACCOUNTS_SCRYPT_N": "2048", "GATEWAY_MAX_DEADLINE_MS": "1500", "FLAG": "yes",
            "EMPTY": "", "BAD_INT": "32k", "LIST": " a, b ,,c ",
        ])
        #expect(try s.int("accounts.scrypt.n") == 2048)
        #expect(try s.milliseconds("gateway.max.deadline.ms") == .milliseconds(1500))
        #expect(try s.bool("flag"))
        #expect(s.string("empty") == nil, "an empty variable is unset")
        #expect(try s.int("missing", default: 7) == 7)
        #expect(s.list("list") == ["a", "b", "c"])
        // A value that does not parse refuses the start, naming the variable.
        #expect { try s.int("bad.int") } throws: { "\($0)".contains("BAD_INT must be an integer") }
        #expect { try s.int("accounts.scrypt.n", range: 1...1000) } throws: { "\($0)".contains("ACCOUNTS_SCRYPT_N must be in 1...1000") }
        #expect { try s.bool("bad.int") } throws: { "\($0)".contains("BAD_INT") }
    }

    @Test func theOutboxRetryPolicyComesFromTheEnvironment() throws {
        func settings(_ env: [String: String]) throws -> ServiceSettings {
            try ServiceSettings(name: "tasks", options: try ServiceOptions.parse(["--dev-credentials"]), environment: env)
        }
        let base = OutboxRetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(300))
        let unchanged = try settings([:]).outboxRetry(base)
        #expect(unchanged.initialDelay == .seconds(1) && unchanged.maximumDelay == .seconds(300))
        let short = try settings(["OUTBOX_RETRY_INITIAL_MS": "50", "OUTBOX_RETRY_MAX_MS": "500"]).outboxRetry(base)
        #expect(short.initialDelay == .milliseconds(50) && short.maximumDelay == .milliseconds(500))
        // A maximum below the default first wait caps it too.
        let capped = try settings(["OUTBOX_RETRY_MAX_MS": "200"]).outboxRetry(base)
        #expect(capped.initialDelay == .milliseconds(200) && capped.maximumDelay == .milliseconds(200))
        #expect { try settings(["OUTBOX_RETRY_MAX_MS": "soon"]).outboxRetry(base) } throws: { "\($0)".contains("OUTBOX_RETRY_MAX_MS") }
        #expect { try settings(["OUTBOX_RETRY_INITIAL_MS": "0"]).outboxRetry(base) } throws: { "\($0)".contains("OUTBOX_RETRY_INITIAL_MS") }
    }

    @Test func flagsWinOverTheEnvironment() throws {
        let options = try ServiceOptions.parse(["--port", "7001", "--data-dir", "/tmp/x", "--dev-credentials"])
        let settings = try ServiceSettings(
            name: "social", options: options,
            environment: [
                "SOCIAL_PORT": "9999", "SOCIAL_HOST": "0.0.0.0", "DATA_DIR": "/tmp/root",
                "TASKS_ADDR": "10.1.2.3:7002",
            ])
        #expect(settings.port == 7001)
        #expect(settings.host == "0.0.0.0")
        #expect(settings.dataDir == "/tmp/x")
        #expect(settings.peerAddress("tasks") == ("10.1.2.3", 7002))
        #expect(settings.peerAddress("finance") == ("127.0.0.1", 9103))
        #expect(settings.devCredentials)
        #expect(settings.serviceToken.count >= 32 && settings.gatewayToken.count >= 32)
        #expect(settings.serviceToken != settings.gatewayToken)
        #expect(throws: (any Error).self) {
            try ServiceSettings(
                name: "social", options: try ServiceOptions.parse([]), environment: ["TASKS_ADDR": "nope", "ALLOW_DEV_CREDENTIALS": "1"])
        }
    }

    /// A malformed peer keepalive refuses the start, naming the variable (it used to fall back to
    /// the default unsaid); a good one reaches the peers' channels.
    @Test func peerKeepaliveIsCheckedAtStart() throws {
        func settings(_ env: [String: String]) throws -> ServiceSettings {
            try ServiceSettings(
                name: "social", options: try ServiceOptions.parse([]), environment: env.merging(["ALLOW_DEV_CREDENTIALS": "1"]) { a, _ in a })
        }
        #expect { try settings(["PEER_KEEPALIVE_TIME_MS": "30s"]) } throws: { "\($0)".contains("PEER_KEEPALIVE_TIME_MS must be an integer") }
        #expect { try settings(["PEER_KEEPALIVE_TIMEOUT_MS": "0"]) } throws: { "\($0)".contains("PEER_KEEPALIVE_TIMEOUT_MS must be in") }
        #expect { try settings(["TASKS_PORT": "91o2"]) } throws: { "\($0)".contains("TASKS_PORT must be an integer") }
        let off = try settings(["PEER_KEEPALIVE_TIME_MS": "0"]).peerChannelConfiguration(host: "127.0.0.1", port: 1)
        #expect(off.keepaliveTime == nil)
        let set = try settings(["PEER_KEEPALIVE_TIME_MS": "5000", "PEER_KEEPALIVE_TIMEOUT_MS": "2000"])
            .peerChannelConfiguration(host: "127.0.0.1", port: 1)
        #expect(set.keepaliveTime == .milliseconds(5000) && set.keepaliveTimeout == .milliseconds(2000))
    }

    /// `LOG_FORMAT` is `text` (the default) or `json`; anything else refuses the start, naming the
    /// variable and what it may be. `--log-format` wins over it.
    @Test func logFormatIsTextOrJSON() throws {
        func settings(_ env: [String: String], _ args: [String] = []) throws -> ServiceSettings {
            try ServiceSettings(
                name: "social", options: try ServiceOptions.parse(args), environment: env.merging(["ALLOW_DEV_CREDENTIALS": "1"]) { a, _ in a })
        }
        #expect(try settings([:]).logFormat == .text)
        #expect(try settings(["LOG_FORMAT": ""]).logFormat == .text)
        #expect(try settings(["LOG_FORMAT": "json"]).logFormat == .json)
        #expect(try settings(["LOG_FORMAT": "JSON"]).logFormat == .json)
        #expect(try settings(["LOG_FORMAT": "text"]).logFormat == .text)
        #expect(try settings(["LOG_FORMAT": "text"], ["--log-format", "json"]).logFormat == .json)
        #expect { try settings(["LOG_FORMAT": "xml"]) } throws: { "\($0)" == "LOG_FORMAT must be one of text, json, got 'xml'" }
        #expect { try settings([:], ["--log-format", "logfmt"]) } throws: { "\($0)".contains("LOG_FORMAT must be one of text, json") }
    }
}

/// Defect 5 of issue 11: no process starts with a missing or well-known credential unless the
/// development flag says so.
@Suite struct CredentialTests {
    static let strongService = "s3rv1ce-" + String(repeating: "x", count: 40)
    static let strongGateway = "g4tew4y-" + String(repeating: "y", count: 40)

    func settings(_ env: [String: String], as needs: Credentials.Needs = .service) throws -> ServiceSettings {
        try ServiceSettings(name: "social", options: try ServiceOptions.parse([]), environment: env, credentials: needs)
    }

    @Test func missingCredentialsRefuseToStart() {
        #expect { try settings([:]) } throws: { "\($0)".contains("SERVICE_TOKEN is not set") }
        #expect { try settings(["SERVICE_TOKEN": Self.strongService]) } throws: { "\($0)".contains("GATEWAY_TOKEN is not set") }
        // The gateway needs only its own.
        #expect(throws: Never.self) { try settings(["GATEWAY_TOKEN": Self.strongGateway], as: .gateway) }
    }

    @Test func placeholdersAndShortCredentialsRefuseToStart() {
        #expect {
            try settings(["SERVICE_TOKEN": "change-me-in-production", "GATEWAY_TOKEN": Self.strongGateway])
        } throws: { "\($0)".contains("well-known placeholder") }
        #expect {
            try settings(["SERVICE_TOKEN": Self.strongService, "GATEWAY_TOKEN": "short-secret"])
        } throws: { "\($0)".contains("too short") }
        // A credential a header cannot carry is refused even for development: it would be
        // replaced on the way and every peer call refused.
        #expect {
            try settings(["SERVICE_TOKEN": Self.strongService + "é", "GATEWAY_TOKEN": Self.strongGateway, "ALLOW_DEV_CREDENTIALS": "1"])
        } throws: { "\($0)".contains("SERVICE_TOKEN must be printable ASCII") }
        #expect {
            try settings(["GATEWAY_TOKEN": "gw token with spaces in it, long enough"], as: .gateway)
        } throws: { "\($0)".contains("GATEWAY_TOKEN must be printable ASCII") }
        // The development flag accepts them (compose's default, local runs).
        #expect(throws: Never.self) {
            try settings(["SERVICE_TOKEN": "change-me-in-production", "GATEWAY_TOKEN": "dev", "ALLOW_DEV_CREDENTIALS": "1"])
        }
    }

    @Test func credentialsComeFromMountedFilesOrAreGeneratedForDevelopment() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("creds-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try (Self.strongService + "\n").write(toFile: "\(dir)/svc", atomically: true, encoding: .utf8)
        let fromFile = try settings(["SERVICE_TOKEN_FILE": "\(dir)/svc", "GATEWAY_TOKEN": Self.strongGateway])
        #expect(fromFile.serviceToken == Self.strongService)

        let dev1 = try settings(["DATA_DIR": dir, "ALLOW_DEV_CREDENTIALS": "1"])
        let dev2 = try settings(["DATA_DIR": dir, "ALLOW_DEV_CREDENTIALS": "1"])
        #expect(dev1.serviceToken == dev2.serviceToken, "one data root, one shared credential")
        #expect(dev1.gatewayToken == dev2.gatewayToken)
        let attributes = try FileManager.default.attributesOfItem(atPath: "\(dir)/service-token")
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
    }
}

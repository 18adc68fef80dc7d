import Contracts
import Foundation
import GRPCContracts
import RPCCore
import RPCTransport
import ServiceKitTesting
import Synchronization
import Testing

@testable import Gateway

/// An upstream that vanished without closing (its link cut, its packets dropped: no FIN, no RST):
/// the gateway's open connection to it stays up, so nothing but its health poll can tell. A
/// failed poll has every connection to that upstream PING; those left unanswered close, and the
/// calls relayed on them answer UNAVAILABLE within seconds instead of waiting for their deadlines.
@Suite struct SilentUpstreamTests {
    @Test func callsToASilentUpstreamAnswerUnavailableBeforeTheirDeadline() async throws {
        let silent = try SilentHTTP2Server()
        defer { silent.close() }
        let h = try await Harness { c in
            c.upstreams[1] = .init(name: "social", host: "127.0.0.1", port: silent.port)
            c.healthInterval = .milliseconds(200)
            c.upstreamKeepaliveTime = nil  // only the health poll can notice here
        }
        defer { Task { await h.stop() } }
        let social = Social_V1_SocialClient(h.client)
        let md = h.bearer(h.keys.token())
        let start = ContinuousClock.now
        do {
            _ = try await social.getNotificationSettings(
                Social_V1_GetNotificationSettingsRequest(), options: CallOptions(timeout: .seconds(30), metadata: md))
            Issue.record("a call to a silent upstream succeeded")
        } catch let e as RPCError {
            #expect(e.code == .unavailable && e.message == "social is unavailable right now: try again shortly", "\(e)")
        }
        #expect(ContinuousClock.now - start < .seconds(10))
        // Other upstreams are unaffected.
        var req = Accounts_V1_LogInRequest()
        req.username = "ada"
        _ = try await Accounts_V1_AccountsClient(h.client).logIn(req)
    }
}

/// Accepts connections on 127.0.0.1, sends an empty SETTINGS frame, then reads and ignores
/// everything (no SETTINGS ACK, no PING ACK, no answer), holding every connection open.
final class SilentHTTP2Server: Sendable {
    let port: Int
    private let listener: Int32
    private let accepted = Mutex<[Int32]>([])

    init() throws {
        (listener, port) = try loopbackSocket(listening: 16)
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    private func acceptLoop() {
        while true {
            let c = accept(listener, nil, nil)
            if c < 0 { return }  // closed
            accepted.withLock { $0.append(c) }
            let settings: [UInt8] = [0, 0, 0, 4, 0, 0, 0, 0, 0]
            _ = settings.withUnsafeBytes { write(c, $0.baseAddress, $0.count) }
            Thread {
                var buffer = [UInt8](repeating: 0, count: 4096)
                while buffer.withUnsafeMutableBytes({ read(c, $0.baseAddress, $0.count) }) > 0 {}
            }.start()
        }
    }

    func close() {
        shutdown(listener, Int32(SHUT_RDWR))
        Foundation.close(listener)
        for c in accepted.withLock({ $0 }) {
            shutdown(c, Int32(SHUT_RDWR))
            Foundation.close(c)
        }
    }
}

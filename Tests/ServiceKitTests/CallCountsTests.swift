import Foundation
import RPCCore
import Synchronization
import Testing

@testable import Observability

/// Issue 19: server call metrics are counted per event loop without shared writes and summed at
/// scrape time; nothing is lost across loops, the shared path, methods not prepared, or a server
/// that has gone.
@Suite(.serialized) struct CallCountsTests {
    static let a = MethodDescriptor(service: "counts.v1.Loops", method: "A", kind: .unary)
    static let b = MethodDescriptor(service: "counts.v1.Loops", method: "B", kind: .unary)
    static let late = MethodDescriptor(service: "counts.v1.Loops", method: "Late", kind: .unary)

    static func value(_ name: String, _ method: String, code: String? = nil, le: String? = nil) -> Double {
        var labels = [("grpc_service", "counts.v1.Loops"), ("grpc_method", method)]
        if let code { labels.append(("grpc_code", code)) }
        if let le { labels.append(("le", le)) }
        return ProcessMetrics.sample(name, labels: labels, in: ProcessMetrics.exposition()) ?? 0
    }

    @Test func countsFromEveryLoopAreSummedAndOutliveTheirServer() throws {
        let before = (
            okA: Self.value("grpc_server_handled_total", "A", code: "OK"),
            notFoundB: Self.value("grpc_server_handled_total", "B", code: "NOT_FOUND"),
            late: Self.value("grpc_server_handled_total", "Late", code: "OK"),
            countA: Self.value("grpc_server_handling_seconds_count", "A"),
            fastA: Self.value("grpc_server_handling_seconds_bucket", "A", le: "0.0001"),
            sumA: Self.value("grpc_server_handling_seconds_sum", "A"),
            bytesA: Self.value("grpc_server_sent_bytes_total", "A")
        )
        var metrics: RPCServerMetrics? = RPCServerMetrics()
        metrics!.prepare([Self.a, Self.b])
        // Two "loops", each written by one thread only (the transport's promise), while a third
        // thread uses the shared path and the scrape reads everything.
        let loopObjects = [NSObject(), NSObject()]  // alive throughout, as a server's loops are
        let loops = loopObjects.map { metrics!.onLoop(ObjectIdentifier($0)) }
        #expect(loops[0] as AnyObject !== loops[1] as AnyObject)
        let perLoop = 20_000
        let shared = metrics!
        var bodies: [@Sendable () -> Void] = loops.map { loop in
            {
                for i in 0..<perLoop {
                    loop.callStarted()
                    let fast = i % 2 == 0
                    loop.callEnded(
                        ServerCallRecord(
                            method: Self.a, code: .ok, duration: fast ? .microseconds(50) : .milliseconds(3),
                            requestMessages: 1, requestBytes: 10, responseMessages: 1, responseBytes: 7))
                    if i % 100 == 0 {
                        loop.callEnded(ServerCallRecord(method: Self.b, code: .notFound, duration: .microseconds(1)))
                        loop.callEnded(ServerCallRecord(method: Self.late, code: .ok, duration: .microseconds(1)))
                    }
                }
            }
        }
        bodies.append {
            for _ in 0..<1000 {
                shared.callStarted()
                shared.callEnded(ServerCallRecord(method: Self.a, code: .ok, duration: .microseconds(50)))
            }
        }
        bodies.append { for _ in 0..<20 { _ = ProcessMetrics.exposition() } }
        Thread.runTogether(bodies)
        withExtendedLifetime(loopObjects) {}
        #expect(metrics!.callsInFlight == -2 * (perLoop / 100) * 2)  // the loops' B and Late calls never started
        let calls = Double(2 * perLoop + 1000)
        #expect(Self.value("grpc_server_handled_total", "A", code: "OK") - before.okA == calls)
        #expect(Self.value("grpc_server_handled_total", "B", code: "NOT_FOUND") - before.notFoundB == Double(2 * perLoop / 100))
        #expect(Self.value("grpc_server_handled_total", "Late", code: "OK") - before.late == Double(2 * perLoop / 100))
        #expect(Self.value("grpc_server_handling_seconds_count", "A") - before.countA == calls)
        #expect(Self.value("grpc_server_handling_seconds_bucket", "A", le: "0.0001") - before.fastA == Double(perLoop + 1000))
        #expect(Self.value("grpc_server_handling_seconds_bucket", "A", le: "0.0025") - before.fastA == Double(perLoop + 1000))
        #expect(Self.value("grpc_server_handling_seconds_bucket", "A", le: "0.005") - before.countA == calls)
        #expect(
            abs(Self.value("grpc_server_handling_seconds_sum", "A") - before.sumA - (Double(perLoop + 1000) * 50e-6 + Double(perLoop) * 3e-3)) < 1e-6)
        #expect(Self.value("grpc_server_sent_bytes_total", "A") - before.bytesA == Double(2 * perLoop * 7))

        // The server goes: its counts stay (counters never go back).
        let okNow = Self.value("grpc_server_handled_total", "A", code: "OK")
        metrics = nil
        #expect(Self.value("grpc_server_handled_total", "A", code: "OK") == okNow)
        #expect(Self.value("grpc_server_handling_seconds_count", "A") - before.countA == calls)
    }

    @Test func labelValuesAreEscaped() {
        #expect(RPCCallTotals.escape(#"a"b\c"#) == #"a\"b\\c"#)
        #expect(RPCCallTotals.escape("plain.v1.Service") == "plain.v1.Service")
    }
}

extension Thread {
    /// Runs each body on a thread of its own, all at once, and returns when all have finished.
    static func runTogether(_ bodies: [@Sendable () -> Void]) {
        let done = DispatchGroup()
        for body in bodies {
            done.enter()
            Thread.detachNewThread {
                body()
                done.leave()
            }
        }
        done.wait()
    }
}

import RPCCore
import Testing

@testable import RPCTransport

/// The pure state behind request-memory limits: the process and connection budgets and the
/// deframer's flow-control accounting (issue 11, defect 2).
@Suite struct RequestBudgetTests {
    @Test func processBudgetAdmitsWithinItsLimitAndAlwaysOneMessage() {
        let budget = RequestBudget()
        #expect(budget.tryCharge(600, limit: 1000))
        #expect(budget.tryCharge(400, limit: 1000))
        #expect(!budget.tryCharge(1, limit: 1000))
        #expect(budget.inUse == 1000)
        budget.release(1000)
        #expect(budget.inUse == 0)
        // Larger than the whole budget, but nothing else is charged: let through, alone.
        #expect(budget.tryCharge(5000, limit: 1000))
        #expect(!budget.tryCharge(10, limit: 1000))
        budget.release(5000)
        #expect(budget.inUse == 0)
    }

    @Test func connectionBudgetQueuesInArrivalOrder() {
        var b = ConnectionRequestBudget(limit: 100)
        #expect(b.request(stream: 1, bytes: 60) == .admitted)
        #expect(b.request(stream: 3, bytes: 50) == .wait)
        // Small enough to fit, but it may not overtake stream 3.
        #expect(b.request(stream: 5, bytes: 10) == .wait)
        #expect(b.admitWaiting().isEmpty)
        b.release(60)
        let admitted = b.admitWaiting()
        #expect(admitted.map(\.stream) == [3, 5])
        #expect(b.admitted == 60)
        #expect(b.waiting.isEmpty)
    }

    @Test func connectionBudgetLetsAnOversizeMessageThroughAlone() {
        var b = ConnectionRequestBudget(limit: 100)
        #expect(b.request(stream: 1, bytes: 500) == .admitted)
        #expect(b.request(stream: 3, bytes: 1) == .wait)
        b.release(500)
        #expect(b.admitWaiting().map(\.stream) == [3])
        #expect(b.request(stream: 5, bytes: 500) == .wait)
        b.release(1)
        #expect(b.admitWaiting().map(\.stream) == [5])
    }

    @Test func connectionBudgetForgetsStreamsThatStopWaiting() {
        var b = ConnectionRequestBudget(limit: 100)
        #expect(b.request(stream: 1, bytes: 100) == .admitted)
        #expect(b.request(stream: 3, bytes: 100) == .wait)
        #expect(b.request(stream: 5, bytes: 100) == .wait)
        b.cancelWait(stream: 3)
        b.release(100)
        #expect(b.admitWaiting().map(\.stream) == [5])
    }

    /// A 5-byte prefix declaring 4 MiB reserves nothing; the buffer grows with the bytes and
    /// never past the message.
    @Test func aDeclaredLengthIsNotReserved() throws {
        var d = MessageDeframer(maxMessageSize: 8 << 20)
        let size = 4 << 20
        try feed(&d, prefix(size)) { _ in }
        #expect(d.bufferedCapacity < 2 * MessageDeframer.initialCapacity)  // (malloc rounds up a little)
        try feed(&d, [UInt8](repeating: 1, count: 100_000)) { _ in }
        #expect(d.bufferedCapacity < 300_000)
        var got: [Int] = []
        try feed(&d, [UInt8](repeating: 1, count: size - 100_000)) { got.append($0.payload.count) }
        #expect(got == [size])
    }

    @Test func smallMessagesAreHeldUntilHandedOver() throws {
        var d = MessageDeframer(maxMessageSize: 1 << 20)
        var emitted: [(Int, Int, Int)] = []
        let msg = prefix(1000) + [UInt8](repeating: 7, count: 1000)
        try feedServer(
            &d, Array(msg[..<600]), smallLimit: 65536,
            admit: { _ in
                Issue.record("small"); return .admitted
            }
        ) { _, _, _ in }
        #expect(d.takeRelease() == 0)
        #expect(d.partialHeld == 600)
        try feedServer(&d, Array(msg[600...]), smallLimit: 65536, admit: { _ in .admitted }) { f, held, charged in
            emitted.append((f.payload.count, held, charged))
        }
        #expect(d.takeRelease() == 0)
        #expect(emitted.count == 1 && emitted[0] == (1000, 1005, 0))
    }

    @Test func admittedMessagesAreReleasedAsTheyArrive() throws {
        var d = MessageDeframer(maxMessageSize: 1 << 20)
        var asked: [Int] = []
        var emitted: [(Int, Int, Int)] = []
        let size = 200_000
        try feedServer(
            &d, prefix(size) + [UInt8](repeating: 1, count: 1000), smallLimit: 65536,
            admit: {
                asked.append($0); return .admitted
            }
        ) { _, _, _ in }
        #expect(asked == [size])
        #expect(d.takeRelease() == 1005)
        try feedServer(&d, [UInt8](repeating: 1, count: size - 1000), smallLimit: 65536, admit: { _ in .admitted }) { f, held, charged in
            emitted.append((f.payload.count, held, charged))
        }
        #expect(d.takeRelease() == size - 1000)
        #expect(emitted.count == 1 && emitted[0] == (size, 0, size))
    }

    @Test func aWaitingMessageIsHeldThenReleasedOnceAdmitted() throws {
        var d = MessageDeframer(maxMessageSize: 1 << 20)
        let size = 100_000
        try feedServer(&d, prefix(size) + [UInt8](repeating: 1, count: 30_000), smallLimit: 65536, admit: { _ in .wait }) { _, _, _ in }
        #expect(d.takeRelease() == 0)
        #expect(d.partialHeld == 30_005)
        #expect(d.admitPartial(charged: size) == 30_005)
        var emitted: [(Int, Int, Int)] = []
        try feedServer(&d, [UInt8](repeating: 1, count: size - 30_000), smallLimit: 65536, admit: { _ in .wait }) { f, held, charged in
            emitted.append((f.payload.count, held, charged))
        }
        #expect(d.takeRelease() == size - 30_000)
        #expect(emitted.count == 1 && emitted[0] == (size, 0, size))
    }

    /// Every byte of a refused chunk is accounted for: held by the partial message, or set aside
    /// to release (so the connection window gets it all back).
    @Test func aRefusedMessageAccountsForEveryByte() throws {
        var d = MessageDeframer(maxMessageSize: 1 << 20)
        let chunk = prefix(10) + [UInt8](repeating: 2, count: 10) + prefix(500_000) + [UInt8](repeating: 3, count: 777)
        var emitted = 0
        do {
            try feedServer(&d, chunk, smallLimit: 65536, admit: { _ in .refused }) { _, held, _ in emitted += held }
            Issue.record("expected a refusal")
        } catch MessageDeframer.Failure.overBudget(let n) {
            #expect(n == 500_000)
        }
        #expect(emitted == 15)
        let (held, charged) = d.dropPartial()
        #expect(held + d.takeRelease() + emitted == chunk.count)
        #expect(charged == 0)
    }

    @Test func theRetryHintDecodes() {
        let e = RPCError.resourceExhausted("busy", retryAfter: .seconds(2))
        #expect(e.code == .resourceExhausted)
        #expect(e.trailers["retry-after"] == "2")
        // google.rpc.Status{code: 8, message: "busy", details: [Any{type_url: …RetryInfo, value: {retry_delay {seconds: 2}}}]}
        let typeURL = Array("type.googleapis.com/google.rpc.RetryInfo".utf8)
        let retryInfo: [UInt8] = [0x0A, 0x02, 0x08, 0x02]
        let any: [UInt8] = [0x0A, UInt8(typeURL.count)] + typeURL + [0x12, UInt8(retryInfo.count)] + retryInfo
        let status: [UInt8] = [0x08, 0x08, 0x12, 0x04] + Array("busy".utf8) + [0x1A, UInt8(any.count)] + any
        #expect(e.details == status)
    }

    // MARK: helpers

    func prefix(_ n: Int) -> [UInt8] {
        [0, UInt8(n >> 24 & 0xff), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)]
    }

    func feed(_ d: inout MessageDeframer, _ bytes: [UInt8], _ emit: (MessageDeframer.Frame) -> Void) throws {
        try bytes.withUnsafeBytes { buf in try d.feed(buf, emit) }
    }

    func feedServer(
        _ d: inout MessageDeframer, _ bytes: [UInt8], smallLimit: Int, admit: (Int) -> MessageDeframer.Admission,
        _ emit: (MessageDeframer.Frame, Int, Int) -> Void
    ) throws {
        try bytes.withUnsafeBytes { buf in try d.feedServer(buf, smallLimit: smallLimit, admit: admit, emit: emit) }
    }
}

@Suite struct CredentialCheckTests {
    static let auth = MethodDescriptor(service: "x.S", method: "A", kind: .unary, visibility: .publicAuthenticated)
    static let open = MethodDescriptor(service: "x.S", method: "P", kind: .unary, visibility: .publicAnonymous)
    static let `internal` = MethodDescriptor(service: "x.S", method: "I", kind: .unary, visibility: .internal)

    func metadata(_ pairs: (String, String)...) -> Metadata {
        var m = Metadata()
        for (k, v) in pairs { m.add(k, v) }
        return m
    }

    @Test func bearerTokensAreRecognisedWithoutParsing() {
        #expect(CredentialCheck.hasBearer(metadata(("authorization", "Bearer abc"))))
        #expect(CredentialCheck.hasBearer(metadata(("authorization", "bearer  abc"))))
        #expect(!CredentialCheck.hasBearer(metadata(("authorization", "Bearer "))))
        #expect(!CredentialCheck.hasBearer(metadata(("authorization", "Basic abc"))))
        #expect(!CredentialCheck.hasBearer(metadata(("authorization", "Bearerabc"))))
        #expect(!CredentialCheck.hasBearer(metadata()))
    }

    @Test func whatEachMarkingNeeds() {
        #expect(CredentialCheck.missingCredential(Self.open, metadata()) == nil)
        #expect(CredentialCheck.missingCredential(Self.auth, metadata())?.code == .unauthenticated)
        #expect(CredentialCheck.missingCredential(Self.auth, metadata(("authorization", "Bearer t"))) == nil)
        #expect(CredentialCheck.missingCredential(Self.auth, metadata(("x-service-token", "s"))) == nil)
        #expect(CredentialCheck.missingCredential(Self.auth, metadata(("x-service-token", "s")), serviceCredential: false)?.code == .unauthenticated)
        #expect(CredentialCheck.missingCredential(Self.internal, metadata(("authorization", "Bearer t")))?.code == .permissionDenied)
        #expect(CredentialCheck.missingCredential(Self.internal, metadata(("x-service-token", "s"))) == nil)
        #expect(CredentialCheck.missingCredential(Self.internal, metadata(), serviceCredential: false)?.code == .unimplemented)
        // Health and reflection need nothing, whatever their marking, wherever they are served.
        let health = MethodDescriptor(service: "grpc.health.v1.Health", method: "Check", kind: .unary)
        #expect(health.isInfrastructure && !Self.internal.isInfrastructure)
        #expect(CredentialCheck.missingCredential(health, metadata()) == nil)
        #expect(CredentialCheck.missingCredential(health, metadata(), serviceCredential: false) == nil)
    }
}

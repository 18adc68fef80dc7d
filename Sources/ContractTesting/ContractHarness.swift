import RPCCore
import RPCTransport

/// Checks a running service against its fixtures: sends `<Method>.request.txtpb` (encoded by
/// protoc, decoded into the generated request type, sent with `RPCClient`) and compares the
/// answer with `<Method>.response.txtpb`, ignoring the fields its `# generated:` line names.
///
/// Both sides are compared as protoc prints them (`protoc --decode`: canonical text, map entries
/// sorted), one line per scalar field, so a difference reads as `- fixture` / `+ live` lines with
/// full field paths:
///
/// ```swift
/// let harness = ContractHarness(host: "127.0.0.1", port: 9101)
/// let result = try await harness.check(service: "accounts", method: "SignUp")
/// #expect(result.matches, "\(result)")
/// await harness.close()
/// ```
///
/// A non-OK status from the service is thrown as the `RPCError` the client received.
public final class ContractHarness: Sendable {
    public let paths: ContractPaths
    public let protoc: Protoc
    private let transport: any ClientTransport
    private let channel: RPCChannel?

    /// A harness with its own channel to `host:port` (plaintext h2c); `close()` closes it.
    public convenience init(host: String = "127.0.0.1", port: Int, paths: ContractPaths = .locate()) {
        self.init(configuration: ChannelConfiguration(host: host, port: port), paths: paths)
    }

    /// A harness with its own channel (TLS, authority, … as configured); `close()` closes it.
    public init(configuration: ChannelConfiguration, paths: ContractPaths = .locate()) {
        let channel = RPCChannel(configuration: configuration)
        self.channel = channel
        self.transport = channel
        self.paths = paths
        self.protoc = Protoc(paths: paths)
    }

    /// A harness over a transport the caller owns (and closes).
    public init(transport: any ClientTransport, paths: ContractPaths = .locate()) {
        self.channel = nil
        self.transport = transport
        self.paths = paths
        self.protoc = Protoc(paths: paths)
    }

    public func close() async { await channel?.close() }

    /// Sends the request fixture of `service`/`method` and compares the response with the response
    /// fixture. `bearerToken` adds `authorization: Bearer <token>` to `metadata`.
    public func check(
        service: String, method: String, metadata: Metadata = Metadata(), bearerToken: String? = nil,
        alsoIgnoring: [String] = [], timeout: Duration = .seconds(10), maxStreamMessages: Int = 8
    ) async throws -> ContractResult {
        let rpc = try lookup(service: service, method: method)
        let requestFixture = try ContractFixture.load(service: service, fileName: "\(method).request.txtpb", paths: paths)
        guard requestFixture.messageName == rpc.descriptor.inputType else {
            throw ContractError("\(requestFixture) is a \(requestFixture.messageName), \(rpc.descriptor) takes \(rpc.descriptor.inputType)")
        }
        let bytes = try await protoc.encode(requestFixture.messageName, text: requestFixture.text, files: paths.protoFiles(service: service))
        return try await send(
            rpc, service: service, requestBytes: bytes, metadata: metadata, bearerToken: bearerToken,
            alsoIgnoring: alsoIgnoring, timeout: timeout, maxStreamMessages: maxStreamMessages)
    }

    /// Like `check(service:method:…)` with a request of the caller's own (when the fixture's ids
    /// must be replaced by ones that exist in the running service). It must be of the RPC's
    /// request type.
    public func check(
        service: String, method: String, request: any ProtoMessage, metadata: Metadata = Metadata(),
        bearerToken: String? = nil, alsoIgnoring: [String] = [], timeout: Duration = .seconds(10),
        maxStreamMessages: Int = 8
    ) async throws -> ContractResult {
        let rpc = try lookup(service: service, method: method)
        guard type(of: request).protoMessageName == rpc.descriptor.inputType else {
            throw ContractError("\(rpc.descriptor) takes \(rpc.descriptor.inputType), not \(type(of: request).protoMessageName)")
        }
        return try await send(
            rpc, service: service, requestBytes: request.serializedBytes(), metadata: metadata,
            bearerToken: bearerToken, alsoIgnoring: alsoIgnoring, timeout: timeout,
            maxStreamMessages: maxStreamMessages)
    }

    /// Compares response bytes with a response fixture, ignoring its generated fields and
    /// `alsoIgnoring`. The offline half of `check`.
    public func compare(
        _ actual: [UInt8], with fixture: ContractFixture, method: String = "", alsoIgnoring: [String] = []
    ) async throws -> ContractResult {
        try await Comparison(harness: self, fixture: fixture, method: method, alsoIgnoring: alsoIgnoring).compare(actual)
    }

    // MARK: - Calls

    private func lookup(service: String, method: String) throws -> ContractRPC {
        guard let s = ContractCatalog.service(service) else {
            throw ContractError("unknown service directory `\(service)` (known: \(ContractCatalog.services.map(\.directory)))")
        }
        guard let rpc = s.rpc(method: method) else { throw ContractError("\(service) has no RPC `\(method)`") }
        return rpc
    }

    private func send(
        _ rpc: ContractRPC, service: String, requestBytes: [UInt8], metadata: Metadata, bearerToken: String?,
        alsoIgnoring: [String], timeout: Duration, maxStreamMessages: Int
    ) async throws -> ContractResult {
        let responseFixture = try ContractFixture.load(service: service, fileName: "\(rpc.descriptor.method).response.txtpb", paths: paths)
        guard responseFixture.messageName == rpc.descriptor.outputType else {
            throw ContractError("\(responseFixture) is a \(responseFixture.messageName), \(rpc.descriptor) returns \(rpc.descriptor.outputType)")
        }
        var options = CallOptions(timeout: timeout, metadata: metadata)
        if let bearerToken { options.metadata.add("authorization", "Bearer \(bearerToken)") }
        let comparison = try await Comparison(harness: self, fixture: responseFixture, method: rpc.descriptor.path, alsoIgnoring: alsoIgnoring)

        switch rpc.descriptor.kind {
        case .unary:
            let bytes = try await unary(rpc.descriptor, rpc.requestType, rpc.responseType, requestBytes, options)
            return try await comparison.compare(bytes)
        case .serverStreaming:
            // The fixture is one element of the stream: read until an element matches, the stream
            // ends, or `maxStreamMessages` arrived; report the closest element otherwise.
            var best: ContractResult?
            let matched: ContractResult? = try await serverStreaming(
                rpc.descriptor, rpc.requestType, rpc.responseType, requestBytes, options, limit: maxStreamMessages
            ) { bytes in
                let r = try await comparison.compare(bytes)
                if best == nil || r.differences.count < best!.differences.count { best = r }
                return r.matches
            }
            if let result = matched ?? best { return result }
            throw ContractError("\(rpc.descriptor) ended its stream without a message")
        case .clientStreaming, .bidirectionalStreaming:
            throw ContractError("\(rpc.descriptor) is \(rpc.descriptor.kind.rawValue): the harness sends one request only")
        }
    }

    private func unary<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: MethodDescriptor, _: Req.Type, _: Res.Type, _ bytes: [UInt8], _ options: CallOptions
    ) async throws -> [UInt8] {
        let request = try Req(serializedBytes: bytes)
        return try await RPCClient(transport: transport).unary(method, request, as: Res.self, options: options).message.serializedBytes()
    }

    private struct StreamStop: Error {}

    /// Returns the first element's comparison that matched, or nil.
    private func serverStreaming<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: MethodDescriptor, _: Req.Type, _: Res.Type, _ bytes: [UInt8], _ options: CallOptions, limit: Int,
        isMatch: ([UInt8]) async throws -> Bool
    ) async throws -> ContractResult? {
        let request = try Req(serializedBytes: bytes)
        var seen = 0
        do {
            try await RPCClient(transport: transport).serverStreaming(method, request, as: Res.self, options: options) { stream in
                for try await element in stream.messages {
                    seen += 1
                    // Stopping cancels the call: live streams (subscriptions) never end on their own.
                    if try await isMatch(element.serializedBytes()) || seen >= limit { throw StreamStop() }
                }
            }
        } catch is StreamStop {
        } catch let error as RPCError where error.code == .deadlineExceeded && seen > 0 {
            // A live stream that went quiet: judge the elements received.
        }
        return nil
    }
}

/// The expected side of one comparison, prepared once: the fixture through protoc, generated
/// paths removed, flattened.
struct Comparison: Sendable {
    let fixture: ContractFixture
    let method: String
    let ignored: [String]
    let expected: [String]
    let files: [String]
    let protoc: Protoc

    init(harness: ContractHarness, fixture: ContractFixture, method: String, alsoIgnoring: [String]) async throws {
        self.fixture = fixture
        self.method = method
        self.ignored = fixture.generatedPaths + alsoIgnoring
        self.protoc = harness.protoc
        self.files = try harness.paths.protoFiles(service: fixture.service)
        let bytes = try await protoc.encode(fixture.messageName, text: fixture.text, files: files)
        let text = try await protoc.decode(fixture.messageName, bytes: bytes, files: files)
        self.expected = ProtoText.flatten(ProtoText.removing(ignored, from: try ProtoText.parse(text)), message: fixture.messageName)
    }

    func compare(_ actualBytes: [UInt8]) async throws -> ContractResult {
        let text = try await protoc.decode(fixture.messageName, bytes: actualBytes, files: files)
        let actual = ProtoText.flatten(ProtoText.removing(ignored, from: try ProtoText.parse(text)), message: fixture.messageName)
        return ContractResult(
            method: method, fixture: fixture.description, ignored: ignored, expected: expected, actual: actual,
            differences: ProtoText.diff(expected: expected, actual: actual))
    }
}

/// The outcome of one live check: the compared lines and their differences.
public struct ContractResult: Sendable, CustomStringConvertible {
    /// `/accounts.v1.Accounts/SignUp` (empty for an offline `compare`).
    public let method: String
    /// `accounts/SignUp.response.txtpb`.
    public let fixture: String
    /// Paths left out of the comparison (`# generated:` plus `alsoIgnoring`).
    public let ignored: [String]
    /// The fixture and the live response, flattened (`user.username: "alice"`), ignored paths removed.
    public let expected: [String]
    public let actual: [String]
    /// `- <line>` only in the fixture, `+ <line>` only in the live response.
    public let differences: [String]

    public var matches: Bool { differences.isEmpty }

    public var description: String {
        let what = method.isEmpty ? "response" : method
        let ignoring = ignored.isEmpty ? "" : " (ignoring \(ignored.joined(separator: ", ")))"
        if matches { return "\(what) matches \(fixture)\(ignoring)" }
        return "\(what) differs from \(fixture)\(ignoring); - fixture, + live:\n"
            + differences.joined(separator: "\n")
    }
}

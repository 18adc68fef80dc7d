import Foundation
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import RPCTLS

/// A fresh self-signed certificate in its own temporary directory, removed by `remove()`.
struct TestCertificate {
    let directory: String
    let certFile: String
    let keyFile: String

    static func make() throws -> TestCertificate {
        let directory = NSTemporaryDirectory() + "rpctls-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        let files = try DevelopmentCertificate.generate(commonName: "localhost", directory: directory)
        return TestCertificate(directory: directory, certFile: files.certFile, keyFile: files.keyFile)
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// What the server's connections reported, in order; tests poll it.
enum ServerEvent: Sendable, Equatable {
    case handshake(String?)
    case error(TLSError)
    case otherError(String)
    case inputClosed
    case inactive
}

final class EventLog: Sendable {
    private let events = Mutex<[ServerEvent]>([])

    func append(_ event: ServerEvent) { events.withLock { $0.append(event) } }
    var all: [ServerEvent] { events.withLock { $0 } }

    /// Waits (polling) until an event matches, or fails the test after `timeout`.
    @discardableResult
    func wait(
        timeout: Duration = .seconds(10), sourceLocation: SourceLocation = #_sourceLocation,
        _ predicate: (ServerEvent) -> Bool
    ) async -> ServerEvent? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let match = all.first(where: predicate) { return match }
            try? await Task.sleep(for: .milliseconds(5))
        }
        Issue.record("no matching server event within \(timeout); saw \(all)", sourceLocation: sourceLocation)
        return nil
    }
}

/// Echoes plaintext back; closes when the peer half-closes; records what it sees.
final class EchoHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let log: EventLog

    init(log: EventLog) { self.log = log }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.write(data, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.flush()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let done = event as? TLSHandshakeCompleted {
            log.append(.handshake(done.negotiatedProtocol))
        } else if let event = event as? ChannelEvent, event == .inputClosed {
            log.append(.inputClosed)
            // Flush first: close fails unflushed writes (NIO semantics, which OpenSSLHandler keeps).
            context.flush()
            context.close(promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let error = error as? TLSError { log.append(.error(error)) } else { log.append(.otherError("\(error)")) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        log.append(.inactive)
        context.fireChannelInactive()
    }
}

/// Delivers each read in pieces of 1…7 bytes, so the TLS handler sees every record boundary cut.
final class SplittingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private var size = 1

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        while bytes.readableBytes > 0 {
            let piece = bytes.readSlice(length: min(size, bytes.readableBytes))!
            size = size % 7 + 1
            context.fireChannelRead(wrapInboundOut(piece))
        }
    }
}

/// A loopback TLS echo server on an ephemeral port. `stop()` closes the listener and every
/// connection it accepted.
final class TestServer: Sendable {
    let channel: Channel
    let log: EventLog
    let connections: Box

    var port: Int { channel.localAddress!.port! }

    private init(channel: Channel, log: EventLog, connections: Box) {
        self.channel = channel
        self.log = log
        self.connections = connections
    }

    static func start(
        _ configuration: TLSConfiguration, splitInbound: Bool = false, handshakeTimeout: TimeAmount? = .seconds(10)
    ) async throws -> TestServer {
        let log = EventLog()
        let accepted = Box()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                accepted.add(channel)
                return channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if splitInbound { try sync.addHandler(SplittingHandler()) }
                    try sync.addHandler(OpenSSLHandler(configuration: configuration, handshakeTimeout: handshakeTimeout))
                    try sync.addHandler(EchoHandler(log: log))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return TestServer(channel: channel, log: log, connections: accepted)
    }

    func stop() async {
        try? await channel.close()
        for connection in connections.channels.withLock({ $0 }) { try? await connection.close() }
    }

    final class Box: Sendable {
        let channels = Mutex<[Channel]>([])
        func add(_ channel: Channel) { channels.withLock { $0.append(channel) } }
    }
}

/// Sends a payload (issued on channelActive, so before the handshake finishes) and collects
/// `expected` bytes back.
final class ClientHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let payload: ByteBuffer?
    let expected: Int
    let handshake: EventLoopPromise<String?>
    let received: EventLoopPromise<ByteBuffer>
    /// With autoRead off: ask for one read on activation and one after each plaintext read only.
    let readOnDemand: Bool
    private var buffer = ByteBuffer()

    init(
        payload: ByteBuffer?, expected: Int, readOnDemand: Bool, handshake: EventLoopPromise<String?>,
        received: EventLoopPromise<ByteBuffer>
    ) {
        self.payload = payload
        self.readOnDemand = readOnDemand
        self.expected = expected
        self.handshake = handshake
        self.received = received
    }

    func channelActive(context: ChannelHandlerContext) {
        if let payload {
            // Several writes, one flush: all queued in the TLS handler until the handshake is done.
            var rest = payload
            while rest.readableBytes > 0 {
                context.write(wrapOutboundOut(rest.readSlice(length: min(100_000, rest.readableBytes))!), promise: nil)
            }
            context.flush()
        }
        context.fireChannelActive()
        if readOnDemand { context.read() }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        buffer.writeBuffer(&bytes)
        if buffer.readableBytes >= expected { received.succeed(buffer) }
        if readOnDemand { context.read() }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let done = event as? TLSHandshakeCompleted {
            handshake.succeed(done.negotiatedProtocol)
            if expected == 0 { received.succeed(buffer) }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        handshake.fail(error)
        received.fail(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        handshake.fail(ChannelError.eof)
        if buffer.readableBytes >= expected { received.succeed(buffer) } else { received.fail(ChannelError.eof) }
        context.fireChannelInactive()
    }
}

struct TestClient {
    let channel: Channel
    let handshake: EventLoopFuture<String?>
    let received: EventLoopFuture<ByteBuffer>

    static func connect(
        port: Int, _ configuration: TLSConfiguration, serverName: String? = nil, payload: ByteBuffer? = nil,
        expected: Int = 0, halfClosure: Bool = false, autoRead: Bool = true
    ) async throws -> TestClient {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let handshake = loop.makePromise(of: String?.self)
        let received = loop.makePromise(of: ByteBuffer.self)
        let channel = try await ClientBootstrap(group: loop)
            .channelOption(.allowRemoteHalfClosure, value: halfClosure)
            .channelOption(.autoRead, value: autoRead)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        OpenSSLHandler(configuration: configuration, serverName: serverName))
                    try channel.pipeline.syncOperations.addHandler(
                        ClientHandler(
                            payload: payload, expected: expected, readOnDemand: !autoRead, handshake: handshake,
                            received: received))
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return TestClient(channel: channel, handshake: handshake.futureResult, received: received.futureResult)
    }
}

/// Fails instead of hanging when the awaited work does not finish in time. Not a task group:
/// `EventLoopFuture.get()` ignores cancellation, and a group would wait for it anyway.
func withTimeout<T: Sendable>(
    _ timeout: Duration = .seconds(20), _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let pending = PendingContinuation<T>()
    return try await withCheckedThrowingContinuation { continuation in
        pending.continuation.withLock { $0 = continuation }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            pending.take()?.resume(throwing: TimeoutError(timeout: timeout))
        }
        Task {
            do {
                let value = try await body()
                pending.take()?.resume(returning: value)
            } catch {
                pending.take()?.resume(throwing: error)
            }
            timer.cancel()
        }
    }
}

/// Resumed exactly once, by whichever of the work and the timer finishes first.
final class PendingContinuation<T: Sendable>: Sendable {
    let continuation = Mutex<CheckedContinuation<T, Error>?>(nil)
    func take() -> CheckedContinuation<T, Error>? { continuation.withLock { $0.take() } }
}

struct TimeoutError: Error { let timeout: Duration }

/// 1 MiB (by default) of a pattern that makes misordered or dropped bytes visible.
func patternBuffer(_ count: Int = 1 << 20) -> ByteBuffer {
    var buffer = ByteBuffer()
    buffer.reserveCapacity(count)
    for i in 0..<count { buffer.writeInteger(UInt8(truncatingIfNeeded: i &* 7 &+ i >> 8)) }
    return buffer
}

/// Runs a process to completion and returns its exit status and output. Output goes to temporary
/// files, not pipes: draining pipes would need threads blocked in read(2), and blocking the
/// cooperative pool (two threads on a two-core machine) starves the test itself.
func run(
    _ executable: String, _ arguments: [String], stdin: String = ""
) async throws -> (
    status: Int32, stdout: String, stderr: String
) {
    let base = NSTemporaryDirectory() + "rpctls-run-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
    let paths = (input: base + ".in", output: base + ".out", errors: base + ".err")
    defer { for path in [paths.input, paths.output, paths.errors] { try? FileManager.default.removeItem(atPath: path) } }
    _ = FileManager.default.createFile(atPath: paths.input, contents: Data(stdin.utf8))
    _ = FileManager.default.createFile(atPath: paths.output, contents: nil)
    _ = FileManager.default.createFile(atPath: paths.errors, contents: nil)
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.standardInput = try FileHandle(forReadingFrom: URL(fileURLWithPath: paths.input))
    process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: paths.output))
    process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: paths.errors))
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
        process.terminationHandler = { _ in continuation.resume() }
        do {
            try process.run()
        } catch {
            process.terminationHandler = nil
            continuation.resume(throwing: error)
        }
    }
    let out = (try? String(contentsOfFile: paths.output, encoding: .utf8)) ?? ""
    let err = (try? String(contentsOfFile: paths.errors, encoding: .utf8)) ?? ""
    return (process.terminationStatus, out, err)
}

func executable(_ name: String) -> String? {
    for directory in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let path = "\(directory)/\(name)"
        if FileManager.default.isExecutableFile(atPath: path) { return path }
    }
    return nil
}

import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// The HTTP client every provider sends through: async-http-client (HTTP/2 over TLS where the
/// server offers it, as APNs requires; HTTP/1.1 otherwise), no redirects, bounded answers.
public final class PushHTTP: Sendable {
    struct Response: Sendable {
        var status: Int
        var headers: HTTPHeaders
        var body: [UInt8]

        func header(_ name: String) -> String? { headers.first(name: name) }
        var bodyText: String { String(decoding: body, as: UTF8.self) }
    }

    let client: HTTPClient
    let timeout: TimeAmount

    /// - Parameters:
    ///   - extraTrustRootsFile: a PEM file of certificates trusted beside the system's (a test
    ///     server's CA); nil in production.
    ///   - timeout: the whole request, connection included.
    public init(extraTrustRootsFile: String? = nil, timeout: Duration = .seconds(10)) {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let extraTrustRootsFile { tls.additionalTrustRoots = [.file(extraTrustRootsFile)] }
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: tls, redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(5), read: .seconds(Int64(max(1, timeout.components.seconds)))))
        configuration.httpVersion = .automatic
        configuration.decompression = .disabled
        client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton), configuration: configuration)
        self.timeout = .nanoseconds(Int64(timeout.components.seconds) * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000)
    }

    /// Answers past this are cut: provider answers are small JSON.
    static let maximumAnswerBytes = 64 * 1024

    struct DeadlineExceeded: Error, CustomStringConvertible {
        var description: String { "no complete answer within the request timeout" }
    }

    /// One deadline over the whole exchange, the answer's body included (async-http-client's own
    /// ends with the head: a server trickling its body would hold the send for ever). A 2xx whose
    /// body cannot be read is still a 2xx: the provider accepted the push.
    func post(_ url: String, headers: HTTPHeaders, body: [UInt8]) async throws -> Response {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers = headers
        request.body = .bytes(body)
        let client = self.client, timeout = self.timeout, prepared = request
        return try await withThrowingTaskGroup(of: Response.self) { group in
            group.addTask {
                let response = try await client.execute(prepared, timeout: timeout)
                let status = Int(response.status.code)
                do {
                    var buffer = try await response.body.collect(upTo: Self.maximumAnswerBytes)
                    return Response(status: status, headers: response.headers, body: buffer.readBytes(length: buffer.readableBytes) ?? [])
                } catch {
                    if (200..<300).contains(status) { return Response(status: status, headers: response.headers, body: []) }
                    throw error
                }
            }
            group.addTask {
                try await Task.sleep(for: .nanoseconds(timeout.nanoseconds))
                throw DeadlineExceeded()
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw DeadlineExceeded() }
            return first
        }
    }

    public func shutdown() async { try? await client.shutdown() }

    /// `Retry-After` (RFC 9110 §10.2.3): seconds or an HTTP-date; nil when absent or unreadable.
    /// Clamped to 1 s … 24 h: a provider never makes us send sooner than a second apart, nor
    /// park a push for longer than the longest a push stays worth sending.
    static func retryAfter(_ value: String?, now: Date = Date()) -> Duration? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        let seconds: Int64
        if let n = Int64(value) {
            seconds = n
        } else if let date = httpDate.withLock({ $0.date(from: value) }) {
            seconds = Int64(date.timeIntervalSince(now).rounded(.up))
        } else {
            return nil
        }
        return .seconds(min(max(seconds, 1), 24 * 3600))
    }

    private static let httpDate = LockedFormatter()
}

/// An IMF-fixdate formatter behind a lock (DateFormatter is not Sendable).
final class LockedFormatter: @unchecked Sendable {
    private let lock = NSLock()
    private let formatter: DateFormatter = {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "GMT")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return f
    }()

    func withLock<T>(_ body: (DateFormatter) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(formatter)
    }
}

/// JSON for the providers' bodies: sorted keys, so a payload's size is stable.
enum PushJSON {
    static func encode(_ object: [String: Any]) -> [UInt8] {
        (try? Array(JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))) ?? Array("{}".utf8)
    }

    static func decode(_ bytes: [UInt8]) -> [String: Any]? {
        guard !bytes.isEmpty else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any]
    }

    /// A short description of an answer for logs and `last_error`.
    static func summary(_ status: Int, _ detail: String) -> String {
        detail.isEmpty ? "HTTP \(status)" : "HTTP \(status) \(detail.prefix(200))"
    }
}

import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Security
import Synchronization

/// Web Push (RFC 8030): the payload encrypted for the browser (RFC 8291, aes128gcm) and POSTed
/// to the subscription's endpoint with `TTL`, `Urgency` and `Topic`, the server identified by
/// VAPID (RFC 8292). The endpoint is a URL the client chose, so by default it must resolve to
/// public addresses only (`allowPrivateEndpoints` is for tests): no push reaches into the
/// cluster's own network.
public final class WebPushProvider: PushProvider {
    public let kind = PushProviderKind.webPush
    let key: P256.PrivateKey
    let subject: String
    let http: PushHTTP
    let allowPrivateEndpoints: Bool
    let clock: @Sendable () -> Int64
    /// VAPID headers per audience (push service origin), reused until an hour before they expire.
    private let vapid = Mutex<[String: (header: String, expiresAt: Int64)]>([:])
    /// 12 hours, not RFC 8292's maximum of 24: a push service whose clock runs behind ours would
    /// see a 24-hour token as too long-lived.
    static let vapidLifetime: Int64 = 12 * 3600

    public init(
        key: P256.PrivateKey, subject: String, http: PushHTTP, allowPrivateEndpoints: Bool = false,
        clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }
    ) throws {
        guard subject.hasPrefix("mailto:") || subject.hasPrefix("https://"), subject.count > 8 else {
            throw PushConfigurationError("the VAPID subject must be a mailto: or https: URL (RFC 8292 §2.1), got '\(subject)'")
        }
        self.key = key
        self.subject = subject
        self.http = http
        self.allowPrivateEndpoints = allowPrivateEndpoints
        self.clock = clock
    }

    func authorization(endpoint: String) throws -> String {
        let now = clock()
        let audience = try VAPID.audience(ofEndpoint: endpoint)
        return try vapid.withLock { cache in
            if let c = cache[audience], c.expiresAt - now > 3600 { return c.header }
            let expiresAt = now + Self.vapidLifetime
            let header = try VAPID.authorization(endpoint: endpoint, subject: subject, expiresAt: expiresAt, now: now, key: key)
            if cache.count >= 1000 { cache.removeAll() }
            cache[audience] = (header, expiresAt)
            return header
        }
    }

    static func plaintext(_ m: PushMessage) -> [UInt8] {
        PushJSON.encode(["notification_id": m.notificationID, "kind": m.kind, "title": m.title, "body": m.body, "badge": m.badge, "data": m.data])
    }

    public func send(_ message: PushMessage, to device: PushDevice) async -> PushOutcome {
        guard case .webPush(let endpoint, let p256dh, let auth) = device else { return .refused("not a Web Push subscription") }
        if !allowPrivateEndpoints {
            if let port = URLComponents(string: endpoint)?.port, port != 443 {
                return .gone("push services listen on port 443, not \(port)")
            }
            switch await EndpointGuard.check(endpoint) {
            case .public: break
            case .privateLiteral(let why): return .gone("the endpoint is not on the public internet: \(why)")
            // A name may resolve privately for a while (a sinkholing resolver, split horizon): this
            // push waits and is dropped when stale; the subscription stays.
            case .private(let why): return .retry("the endpoint resolves to a private address: \(why)", retryAfter: nil, providerWide: false)
            case .unresolved(let why): return .retry("the endpoint's host does not resolve: \(why)", retryAfter: nil, providerWide: false)
            }
        }
        let now = clock()
        let ttl = max(0, message.expiresAt - now)
        guard ttl > 0 else { return .refused("expired before it could be sent") }
        guard
            let fitted = message.fitted(
                into: WebPushEncryption.maximumPlaintextByteCount, encodedSize: { Self.plaintext($0).count })
        else { return .refused("the payload does not fit Web Push's \(WebPushEncryption.maximumPlaintextByteCount) bytes") }
        let body: [UInt8]
        let authorization: String
        do {
            body = try WebPushEncryption.encrypt(Self.plaintext(fitted), p256dh: p256dh, auth: auth)
            authorization = try self.authorization(endpoint: endpoint)
        } catch {
            return .gone("the subscription's keys or endpoint cannot be used: \(error)")
        }
        var headers = HTTPHeaders()
        headers.add(name: "authorization", value: authorization)
        headers.add(name: "ttl", value: String(ttl))
        headers.add(name: "urgency", value: message.urgent ? "high" : "normal")
        if Self.isTopic(message.notificationID) { headers.add(name: "topic", value: message.notificationID) }
        headers.add(name: "content-encoding", value: "aes128gcm")
        headers.add(name: "content-type", value: "application/octet-stream")
        let r: PushHTTP.Response
        do {
            r = try await http.post(endpoint, headers: headers, body: body)
        } catch {
            // One push service (one browser vendor) down: this subscription backs off alone.
            return .retry("the push service is unreachable: \(error)", retryAfter: nil, providerWide: false)
        }
        let outcome = Self.outcome(r)
        if r.status == 401 || r.status == 403, let audience = try? VAPID.audience(ofEndpoint: endpoint) {
            _ = vapid.withLock { $0.removeValue(forKey: audience) }  // signed anew on the retry
        }
        return outcome
    }

    /// RFC 8030 §5.4: at most 32 characters of the URL-safe base64 alphabet.
    static func isTopic(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= 32
            && s.utf8.allSatisfy {
                (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) || $0 == 0x2D || $0 == 0x5F
            }
    }

    /// RFC 8030 §5 and what push services answer: 201 accepted; 404/410 the subscription is gone.
    static func outcome(_ r: PushHTTP.Response) -> PushOutcome {
        let summary = PushJSON.summary(r.status, r.bodyText.prefix(120).filter { !$0.isNewline })
        switch r.status {
        case 200...202: return .delivered
        case 404, 410: return .gone(summary)
        case 429: return .retry(summary, retryAfter: PushHTTP.retryAfter(r.header("retry-after")), providerWide: false)
        // Our VAPID token refused (a clock apart, a key the service does not like): signed anew, retried.
        case 401, 403: return .retry(summary, retryAfter: nil, providerWide: false)
        case 500...: return .retry(summary, retryAfter: PushHTTP.retryAfter(r.header("retry-after")), providerWide: false)
        default: return .refused(summary)
        }
    }

    public func shutdown() async {}
}

/// Whether a URL's host is on the public internet: IP literals are checked as they are, names
/// by every address they resolve to (a name with one private address is refused).
enum EndpointGuard {
    enum Verdict: Sendable, Equatable {
        case `public`
        /// A local name, or an IP literal that is not public: it will never be.
        case privateLiteral(String)
        /// A name that resolves to a private address now.
        case `private`(String)
        case unresolved(String)
    }

    /// Lookups block a thread: their own few, never the event loops' or the shared pool's, and a
    /// lookup that takes longer than `lookupTimeout` is abandoned (its thread finishes it later).
    static let resolverPool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 4)
        pool.start()
        return pool
    }()
    static let lookupTimeout: Duration = .seconds(3)

    static func check(_ endpoint: String) async -> Verdict {
        guard let host = URLComponents(string: endpoint)?.host, !host.isEmpty else { return .private("no host") }
        let name = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        let lower = name.lowercased()
        if lower == "localhost" || lower.hasSuffix(".localhost") || lower.hasSuffix(".local") || lower.hasSuffix(".internal") {
            return .privateLiteral("\(name) is a local name")
        }
        if let literal = ipAddress(name) {
            return isPublic(literal) ? .public : .privateLiteral("\(name) is a private or reserved address")
        }
        let addresses: [[UInt8]]
        do {
            addresses = try await withThrowingTaskGroup(of: [[UInt8]].self) { group in
                group.addTask { try await resolverPool.runIfActive { try resolve(name) } }
                group.addTask {
                    try await Task.sleep(for: lookupTimeout)
                    throw ResolveError(description: "no answer within \(lookupTimeout)")
                }
                defer { group.cancelAll() }
                return try await group.next() ?? []
            }
        } catch {
            return .unresolved("\(name): \(error)")
        }
        if addresses.isEmpty { return .unresolved("\(name) has no address") }
        for a in addresses where !isPublic(a) { return .private("\(name) resolves to a private or reserved address") }
        return .public
    }

    struct ResolveError: Error, CustomStringConvertible {
        var description: String
    }

    static func ipAddress(_ s: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, s, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, s, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }

    static func resolve(_ name: String) throws -> [[UInt8]] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(name, nil, &hints, &result)
        guard rc == 0, let first = result else { throw ResolveError(description: String(cString: gai_strerror(rc))) }
        defer { freeaddrinfo(first) }
        var out: [[UInt8]] = []
        var p: UnsafeMutablePointer<addrinfo>? = first
        while let ai = p {
            if ai.pointee.ai_family == AF_INET, let sa = ai.pointee.ai_addr {
                var a = sa.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
                out.append(withUnsafeBytes(of: &a) { Array($0) })
            } else if ai.pointee.ai_family == AF_INET6, let sa = ai.pointee.ai_addr {
                var a = sa.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_addr }
                out.append(withUnsafeBytes(of: &a) { Array($0) })
            }
            p = ai.pointee.ai_next
        }
        return out
    }

    /// False for loopback, private (RFC 1918, ULA), shared (CGNAT), link-local, unspecified,
    /// multicast, documentation, benchmarking and reserved ranges, IPv4 inside IPv6 judged as IPv4.
    static func isPublic(_ a: [UInt8]) -> Bool {
        if a.count == 4 {
            switch (a[0], a[1]) {
            case (0, _), (10, _), (127, _), (169, 254), (192, 168), (224...255, _): return false
            case (100, 64...127), (172, 16...31), (198, 18...19): return false
            case (192, 0) where a[2] == 0 || a[2] == 2, (198, 51) where a[2] == 100, (203, 0) where a[2] == 113: return false
            case (192, 88) where a[2] == 99: return false  // 6to4 relays
            default: return true
            }
        }
        guard a.count == 16 else { return false }
        if a[0..<10].allSatisfy({ $0 == 0 }) && a[10] == 0xFF && a[11] == 0xFF { return isPublic(Array(a[12...])) }  // ::ffff:v4
        if a[0..<12].allSatisfy({ $0 == 0 }) { return false }  // ::, ::1, IPv4-compatible
        if a[0] & 0xFE == 0xFC || a[0] == 0xFF { return false }  // ULA, multicast
        if a[0] == 0xFE && a[1] & 0xC0 == 0x80 { return false }  // link-local
        if a[0] == 0xFE && a[1] & 0xC0 == 0xC0 { return false }  // site-local (deprecated)
        if a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0D && a[3] == 0xB8 { return false }  // documentation
        if a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x00 && a[3] == 0x00 { return false }  // Teredo: the IPv4 is hidden
        if a[0] == 0x20 && a[1] == 0x02 { return isPublic(Array(a[2..<6])) }  // 6to4: judge the IPv4 inside
        if a[0] == 0x01 && a[1..<8].allSatisfy({ $0 == 0 }) { return false }  // discard-only 100::/64
        if a[0] == 0x00 && a[1] == 0x64 && a[2] == 0xFF && a[3] == 0x9B {  // NAT64 (well-known and local-use)
            return a[4..<12].allSatisfy({ $0 == 0 }) ? isPublic(Array(a[12...])) : false
        }
        return true
    }
}

import Contracts
import Security
import ServiceKit

/// A push target as RegisterPushTarget stores it: the request's `PushTarget` after the
/// contract's field rules, normalised (the APNs token in lower case, the endpoint's scheme and
/// host in lower case, the Web Push keys as unpadded base64url).
public struct PushTargetSpec: Sendable, Equatable {
    /// The `kind` column: which provider delivers to it.
    public enum Kind: Int64, Sendable {
        case apns = 1, fcm = 2, webPush = 3
    }

    public var kind: Kind
    /// What identifies the registration across all users (`push_targets.token_key`, unique): the
    /// kind, then the APNs device token, the FCM registration token or the Web Push endpoint.
    /// The same key registered by another user moves the target to them.
    public var tokenKey: String
    /// APNs: the device token (lower-case hex), the topic, the environment's number.
    public var apnsDeviceToken: String?
    public var apnsTopic: String?
    public var apnsEnvironment: Int32?
    /// FCM: the registration token.
    public var fcmRegistrationToken: String?
    /// Web Push: the endpoint and the subscription's keys.
    public var webPushEndpoint: String?
    public var webPushP256dh: String?
    public var webPushAuth: String?
    /// The label, trimmed ("" = none).
    public var label: String
}

/// The field rules of `social.v1.PushTarget` (the contract's comments), pure: each bad field is
/// named by its path from the request ("target.web_push.p256dh").
public enum PushTargetRules {
    /// APNs device tokens: 32..100 bytes, as 64..200 hex digits.
    public static let apnsTokenHexDigits = 64...200
    public static let topicLength = 1...255
    public static let fcmTokenLength = 1...4096
    public static let endpointMaxBytes = 2048
    public static let labelLength = 0...64
    /// Bytes of `keys.auth` (RFC 8291 §3.2: 16 random octets).
    public static let authBytes = 16

    /// The stored form of `target` (nil when a field is bad: `errors` names each).
    public static func spec(_ target: Social_V1_PushTarget?, field: String = "target", into errors: inout FieldErrors) -> PushTargetSpec? {
        guard let target else {
            errors.add(field, "required: set exactly one of apns, fcm or web_push")
            return nil
        }
        let before = errors.violations.count
        let label = FieldRules.text(target.label, field: "\(field).label", labelLength, into: &errors)
        let spec: PushTargetSpec
        switch target.destination {
        case nil:
            errors.add(field, "set exactly one of apns, fcm or web_push")
            return nil
        case .apns(let apns)?:
            let path = "\(field).apns"
            let token = Self.apnsDeviceToken(apns.deviceToken, field: "\(path).device_token", into: &errors)
            let topic = Self.topic(apns.topic, field: "\(path).topic", into: &errors)
            switch apns.environment {
            case .production, .sandbox: break
            case .unspecified: errors.add("\(path).environment", "required: APNS_ENVIRONMENT_PRODUCTION or APNS_ENVIRONMENT_SANDBOX")
            case .unrecognized: errors.add("\(path).environment", "unknown APNs environment")
            }
            spec = PushTargetSpec(
                kind: .apns, tokenKey: "apns:\(token)", apnsDeviceToken: token, apnsTopic: topic,
                apnsEnvironment: apns.environment.rawValue, label: label)
        case .fcm(let fcm)?:
            let token = Self.fcmRegistrationToken(fcm.registrationToken, field: "\(field).fcm.registration_token", into: &errors)
            spec = PushTargetSpec(kind: .fcm, tokenKey: "fcm:\(token)", fcmRegistrationToken: token, label: label)
        case .webPush(let web)?:
            let path = "\(field).web_push"
            let endpoint = Self.endpoint(web.endpoint, field: "\(path).endpoint", into: &errors)
            let p256dh = Self.p256dh(web.p256dh, field: "\(path).p256dh", into: &errors)
            let auth = Self.auth(web.auth, field: "\(path).auth", into: &errors)
            spec = PushTargetSpec(
                kind: .webPush, tokenKey: "webpush:\(endpoint)", webPushEndpoint: endpoint, webPushP256dh: p256dh,
                webPushAuth: auth, label: label)
        }
        return errors.violations.count == before ? spec : nil
    }

    // MARK: APNs

    /// An even number of 64..200 hex digits, either case; returned in lower case.
    @discardableResult
    public static func apnsDeviceToken(_ raw: String, field: String, into errors: inout FieldErrors) -> String {
        let n = raw.utf8.count
        if n == 0 {
            errors.add(field, "required")
        } else if !raw.utf8.allSatisfy(isHexDigit) {
            errors.add(field, "must be hex digits (the device token as hex)")
        } else if !apnsTokenHexDigits.contains(n) || n % 2 != 0 {
            errors.add(field, "must be an even number of 64 to 200 hex digits (32 to 100 bytes)")
        }
        return raw.lowercased()
    }

    /// A bundle id: 1..255 characters of letters, digits, "-" and ".", in non-empty dot-separated
    /// parts ("com.example.tasks").
    @discardableResult
    public static func topic(_ raw: String, field: String, into errors: inout FieldErrors) -> String {
        let bytes = Array(raw.utf8)
        if bytes.isEmpty {
            errors.add(field, "required (the app's bundle id)")
        } else if !topicLength.contains(bytes.count) {
            errors.add(field, "must be at most 255 characters")
        } else if !bytes.allSatisfy({ isAlphanumeric($0) || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ".") })
            || raw.split(separator: ".", omittingEmptySubsequences: false).contains(where: \.isEmpty)
        {
            errors.add(field, "must be a bundle id: letters, digits and \"-\" in non-empty parts separated by \".\"")
        }
        return raw
    }

    // MARK: FCM

    /// 1..4096 printable ASCII characters without spaces (0x21..0x7E), as sent.
    @discardableResult
    public static func fcmRegistrationToken(_ raw: String, field: String, into errors: inout FieldErrors) -> String {
        let n = raw.utf8.count
        if n == 0 {
            errors.add(field, "required")
        } else if !fcmTokenLength.contains(n) {
            errors.add(field, "must be at most 4096 characters")
        } else if !raw.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) {
            errors.add(field, "must be printable ASCII without spaces")
        }
        return raw
    }

    // MARK: Web Push

    /// An absolute https URL with a host, at most 2048 bytes of printable ASCII (the characters
    /// RFC 3986 allows, percent escapes well formed), without user info or fragment. Returned
    /// with the scheme and host (the authority) in lower case: the registration's identity.
    @discardableResult
    public static func endpoint(_ raw: String, field: String, into errors: inout FieldErrors) -> String {
        let bytes = Array(raw.utf8)
        if bytes.isEmpty {
            errors.add(field, "required")
            return raw
        }
        if bytes.count > endpointMaxBytes {
            errors.add(field, "must be at most \(endpointMaxBytes) bytes")
            return raw
        }
        switch normalisedEndpoint(bytes) {
        case .success(let url): return url
        case .failure(let problem):
            errors.add(field, problem.description)
            return raw
        }
    }

    public enum EndpointProblem: Error, Equatable, CustomStringConvertible {
        case notHTTPS, characters, badEscape, userInfo, fragment, noHost, badHost, badPort
        public var description: String {
            switch self {
            case .notHTTPS: "must be an https URL (https://host/path)"
            case .characters: "must be a URL of printable ASCII (spaces and other characters percent-encoded)"
            case .badEscape: "has a \"%\" not followed by two hex digits"
            case .userInfo: "must not contain user info (user@host)"
            case .fragment: "must not contain a fragment (#…)"
            case .noHost: "must name a host"
            case .badHost: "has a malformed host"
            case .badPort: "has a port that is not 1 to 65535"
            }
        }
    }

    static func normalisedEndpoint(_ bytes: [UInt8]) -> Result<String, EndpointProblem> {
        let scheme = Array("https://".utf8)
        guard bytes.count >= scheme.count, zip(bytes, scheme).allSatisfy({ lowered($0) == $1 }) else { return .failure(.notHTTPS) }
        let rest = bytes[scheme.count...]
        guard rest.allSatisfy(isURLCharacter) else { return .failure(.characters) }
        if rest.contains(UInt8(ascii: "#")) { return .failure(.fragment) }
        var i = rest.startIndex
        while let p = rest[i...].firstIndex(of: UInt8(ascii: "%")) {
            guard p + 2 < rest.endIndex, isHexDigit(rest[p + 1]), isHexDigit(rest[p + 2]) else { return .failure(.badEscape) }
            i = p + 3
        }
        let authorityEnd = rest.firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") } ?? rest.endIndex
        let authority = rest[rest.startIndex..<authorityEnd]
        if authority.contains(UInt8(ascii: "@")) { return .failure(.userInfo) }
        // host, or [IPv6], then an optional :port
        var host = authority[...]
        var port: ArraySlice<UInt8>?
        if authority.first == UInt8(ascii: "[") {
            guard let close = authority.firstIndex(of: UInt8(ascii: "]")) else { return .failure(.badHost) }
            host = authority[authority.startIndex...close]
            let inside = authority[(authority.startIndex + 1)..<close]
            guard !inside.isEmpty, inside.allSatisfy({ isHexDigit($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") }) else {
                return .failure(.badHost)
            }
            let after = authority[(close + 1)...]
            if !after.isEmpty {
                guard after.first == UInt8(ascii: ":") else { return .failure(.badHost) }
                port = after.dropFirst()
            }
        } else {
            if let colon = authority.firstIndex(of: UInt8(ascii: ":")) {
                host = authority[authority.startIndex..<colon]
                port = authority[(colon + 1)...]
            }
            if host.isEmpty { return .failure(.noHost) }
            let labels = host.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
            guard
                labels.allSatisfy({ label in
                    !label.isEmpty && label.allSatisfy { isAlphanumeric($0) || $0 == UInt8(ascii: "-") }
                })
            else { return .failure(.badHost) }
        }
        if let port {
            guard (1...5).contains(port.count), port.allSatisfy(isDigit), let n = Int(String(decoding: port, as: UTF8.self)), (1...65535).contains(n)
            else { return .failure(.badPort) }
        }
        let normalised = scheme + authority.map(lowered) + rest[authorityEnd...]
        return .success(String(decoding: normalised, as: UTF8.self))
    }

    /// `keys.p256dh`: base64url decoding to a 65-byte uncompressed point on P-256 (first byte
    /// 0x04). Returned as unpadded base64url.
    @discardableResult
    public static func p256dh(_ raw: String, field: String, into errors: inout FieldErrors) -> String {
        guard let bytes = base64url(raw, field: field, into: &errors) else { return raw }
        if bytes.count != P256.uncompressedPointByteCount {
            errors.add(field, "must decode to 65 bytes (an uncompressed P-256 public key), got \(bytes.count)")
        } else if bytes[0] != 0x04 {
            errors.add(field, "must be an uncompressed point (first byte 0x04)")
        } else if !P256.isValidUncompressedPublicKey(bytes) {
            errors.add(field, "is not a point on the curve P-256")
        }
        return Base64URL.encode(bytes)
    }

    /// `keys.auth`: base64url decoding to exactly 16 bytes. Returned as unpadded base64url.
    @discardableResult
    public static func auth(_ raw: String, field: String, into errors: inout FieldErrors) -> String {
        guard let bytes = base64url(raw, field: field, into: &errors) else { return raw }
        if bytes.count != authBytes { errors.add(field, "must decode to exactly 16 bytes, got \(bytes.count)") }
        return Base64URL.encode(bytes)
    }

    /// Unpadded base64url; up to two trailing "=" are accepted and dropped (some libraries pad).
    static func base64url(_ raw: String, field: String, into errors: inout FieldErrors) -> [UInt8]? {
        if raw.isEmpty {
            errors.add(field, "required")
            return nil
        }
        var text = Substring(raw)
        for _ in 0..<2 where text.hasSuffix("=") { text = text.dropLast() }
        guard text.utf8.count <= 1024, let bytes = Base64URL.decode(text) else {
            errors.add(field, "must be base64url (RFC 4648 §5: A-Z a-z 0-9 - _)")
            return nil
        }
        return bytes
    }

    // MARK: Characters

    static func isDigit(_ c: UInt8) -> Bool { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) }
    static func isHexDigit(_ c: UInt8) -> Bool {
        isDigit(c) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(c) || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(c)
    }
    static func isAlphanumeric(_ c: UInt8) -> Bool {
        isDigit(c) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c)
    }
    static func lowered(_ c: UInt8) -> UInt8 { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c) ? c + 32 : c }
    /// RFC 3986's unreserved, sub-delims, gen-delims and "%".
    static func isURLCharacter(_ c: UInt8) -> Bool { isAlphanumeric(c) || urlPunctuation.contains(c) }
    static let urlPunctuation = Set("-._~!$&'()*+,;=:@/?#[]%".utf8)
}

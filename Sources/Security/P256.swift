internal import COpenSSL

/// The curve P-256 (secp256r1, OpenSSL's prime256v1), as far as social needs it today: checking
/// the public key of a Web Push subscription (`keys.p256dh`, RFC 8291) when it is registered, so
/// a key that cannot be used for the ECDH of a push is refused then rather than failing every
/// push later. Through OpenSSL, which the package already links (no swift-crypto dependency).
public enum P256 {
    /// Bytes of an uncompressed point: 0x04 ‖ X (32) ‖ Y (32) (SEC 1 §2.3.3, X9.62).
    public static let uncompressedPointByteCount = 65

    /// True when `bytes` is an uncompressed point (65 bytes, first byte 0x04) that lies on P-256
    /// and is not the point at infinity: what the ECDH of RFC 8291 needs from `p256dh`.
    public static func isValidUncompressedPublicKey(_ bytes: [UInt8]) -> Bool {
        guard bytes.count == uncompressedPointByteCount, bytes[0] == 0x04 else { return false }
        guard let group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1) else {
            ERR_clear_error()
            return false
        }
        defer { EC_GROUP_free(group) }
        guard let point = EC_POINT_new(group) else {
            ERR_clear_error()
            return false
        }
        defer { EC_POINT_free(point) }
        // oct2point refuses coordinates outside the field and points off the curve; the explicit
        // checks below say so in this code rather than relying on that.
        let decoded = bytes.withUnsafeBufferPointer { EC_POINT_oct2point(group, point, $0.baseAddress, $0.count, nil) } == 1
        let valid = decoded && EC_POINT_is_at_infinity(group, point) == 0 && EC_POINT_is_on_curve(group, point, nil) == 1
        ERR_clear_error()  // a refused point leaves errors on this thread's queue
        return valid
    }
}

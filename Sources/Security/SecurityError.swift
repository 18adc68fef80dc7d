/// Failures of the crypto layer that a caller can act on (bad key material, bad parameters, files).
public enum SecurityError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Key bytes, PEM or a key file that is not what it should be.
    case invalidKey(String)
    /// Parameters outside what we accept (scrypt cost, lengths).
    case invalidParameters(String)
    /// Reading or writing a key file failed.
    case io(String)
    /// OpenSSL reported an error: the operation and OpenSSL's queue of messages.
    case openSSL(String)

    public var description: String {
        switch self {
        case .invalidKey(let m): "invalid key: \(m)"
        case .invalidParameters(let m): "invalid parameters: \(m)"
        case .io(let m): "key file: \(m)"
        case .openSSL(let m): "OpenSSL: \(m)"
        }
    }
}

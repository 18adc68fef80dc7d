extension Duration {
    /// Whole milliseconds (truncated): SQL timestamps, C timeouts, messages.
    public var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }
    /// Seconds as a floating-point number (rates, backoff).
    public var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

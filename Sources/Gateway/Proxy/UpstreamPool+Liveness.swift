import RPCTransport

extension UpstreamPool {
    /// Asks every open connection to this upstream for a PING answered within `timeout`; those
    /// that stay silent close, failing their calls with UNAVAILABLE (`RPCChannel.checkLiveness`).
    /// The gateway's health poll calls it when a health check of this upstream fails: a link cut
    /// or dropped packets close nothing, so without it the relayed calls on the serving loops'
    /// connections would wait for their deadlines (up to `maxDeadline`) or for the keepalive.
    func checkConnections(timeout: Duration) {
        for c in allChannels { c.channel.checkLiveness(timeout: timeout) }
    }
}

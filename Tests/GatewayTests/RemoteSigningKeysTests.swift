import RPCCore
import RPCTransport
import ServiceKit
import Testing

@Suite struct RemoteSigningKeysTests {
    /// While accounts is away, calls inside the minimum refresh interval fail without a fetch,
    /// and say why the last fetch failed rather than only that one was tried a moment ago.
    @Test func failuresInsideTheRefreshIntervalNameTheLastCause() async throws {
        // Nothing listens on port 1: every fetch is refused at once.
        let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: 1))
        let keys = RemoteSigningKeys(client: channel.client, minRefreshInterval: .seconds(60))
        var messages: [String] = []
        for _ in 0..<2 {
            do {
                _ = try await keys.keys()
                Issue.record("keys() succeeded with nothing listening")
            } catch let error as RPCError {
                #expect(error.code == .unavailable)
                messages.append(error.message)
            }
        }
        await channel.close()
        try #require(messages.count == 2)
        let prefix = "cannot fetch token keys from accounts: "
        #expect(messages[0].hasPrefix(prefix), "\(messages[0])")
        #expect(messages[1].contains("tried less than"), "\(messages[1])")
        let cause = String(messages[0].dropFirst(prefix.count))
        #expect(!cause.isEmpty && messages[1].contains(cause), "\(messages)")
    }
}

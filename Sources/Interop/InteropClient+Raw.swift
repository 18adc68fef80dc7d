import RPCCore

/// Calls below the typed stubs, for what they hide or cannot express: the compressed flag of each
/// response message, and per-message request compression.
extension InteropClient {
    struct RawResult {
        /// Response messages (decompressed by the transport) with their compressed flags.
        var messages: [RawMessageStream.InboundMessage]
        var status: RPCStatus
        var trailers: Metadata

        func checkOK(_ what: String) throws {
            try check(status.code == .ok, "\(what): call ended \(status.code.name): \(status.message.debugDescription)")
        }
    }

    /// Sends `requests` (each compressed or not), half-closes, reads every response and the status.
    func rawCall(
        _ method: MethodDescriptor, _ requests: [(bytes: [UInt8], compress: Bool)],
        options: CallOptions
    ) async throws -> RawResult {
        let call = try await client.transport.startCall(method, options: options)
        return try await withTaskCancellationHandler {
            do {
                for request in requests { try await call.send(request.bytes, compress: request.compress) }
                try await call.closeSend()
            } catch {
                // The server may have ended the call early: its status says why.
                let (status, trailers) = await call.finalStatus()
                if status.code == .ok { throw error }
                return RawResult(messages: [], status: status, trailers: trailers)
            }
            var messages: [RawMessageStream.InboundMessage] = []
            do {
                for try await message in call.responses { messages.append(message) }
            } catch {
                // A failed call ends its response stream with the status, read next.
            }
            let (status, trailers) = await call.finalStatus()
            return RawResult(messages: messages, status: status, trailers: trailers)
        } onCancel: {
            call.cancel()
        }
    }
}

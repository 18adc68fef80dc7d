import NIOCore

/// A connection as what it runs reaches it from other threads: its handler (only touched on its
/// loop) and that loop. One per connection (`reuse`), made on its first call and dropped at the
/// connection's teardown (it refers to the connection): a stream or a call holds one reference
/// where it held three (the handler, and its loop twice).
final class ConnectionLink<Handler: AnyObject>: Sendable {
    let handler: NIOLoopBound<Handler>
    let loop: any EventLoop

    init(_ handler: Handler, on loop: any EventLoop) {
        self.handler = NIOLoopBound(handler, eventLoop: loop)
        self.loop = loop
    }

    /// The link `slot` holds, made for `handler` the first time.
    static func reuse(_ slot: inout ConnectionLink?, _ handler: Handler, on loop: any EventLoop) -> ConnectionLink {
        if let slot { return slot }
        let made = ConnectionLink(handler, on: loop)
        slot = made
        return made
    }
}

/// A server connection as its calls' handlers reach it (`ServerStream.owner`).
typealias StreamOwner = ConnectionLink<ServerConnectionHandler>
/// A client connection as its calls reach it (`CallLink.Target`).
typealias ClientConnectionLink = ConnectionLink<ClientConnectionHandler>

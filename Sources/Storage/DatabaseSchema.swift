/// What a service's database is: which service owns it, its file in the data directory and its
/// migrations. One value per service, used to open the database (`Database.open(directory:schema:)`)
/// and by the tools that work on the file beside a running service (`Database.backup`,
/// `Database.restore`), so they all agree on the file and on what "newer schema" means.
public struct DatabaseSchema: Sendable {
    /// The service's name (`accounts`, `social`, …). `open` records it in the database
    /// (`storage_metadata`), so a file can always tell whose it is: `restore` refuses another
    /// service's file and `open` refuses to run on it.
    public var service: String
    /// The file in the data directory (`<service>.sqlite` unless said otherwise).
    public var fileName: String
    /// Every migration this version knows, in order.
    public var migrations: [Migration]

    public init(service: String, fileName: String? = nil, migrations: [Migration]) {
        self.service = service
        self.fileName = fileName ?? "\(service).sqlite"
        self.migrations = migrations
    }
}

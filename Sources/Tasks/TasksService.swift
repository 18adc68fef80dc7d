import Contracts
import RPCCore
import ServiceKit

/// `tasks.v1.Tasks`: the public API. Each area's RPCs are in the area's own file
/// (`TeamTasks/TeamTasksService.swift`, `Chores/ChoresService.swift`, …), as extensions of this
/// thin struct over the shared `TasksCore`.
public struct TasksService: Tasks_V1_TasksService {
    let core: TasksCore
}

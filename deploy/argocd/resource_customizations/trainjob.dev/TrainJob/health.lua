-- Argo CD health of a TrainJob (trainjob.dev/v1alpha1), from the status the trainjob-operator
-- writes: Progressing until the operator has seen the current spec and while the job is
-- pending, starting, running or restarting; Healthy once it succeeded; Degraded once it
-- failed (with the Failed condition's message); Suspended while spec.suspend holds it.
-- Argo CD runs it with gopher-lua (Lua 5.1). docs/guides/gitops.md shows how to install it.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function message(status, fallback)
  if status.message ~= nil and status.message ~= "" then
    return status.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the trainjob-operator to reconcile the TrainJob"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the trainjob-operator to observe generation " .. generation ..
    " (status is of generation " .. status.observedGeneration .. ")"
  return hs
end

local phase = status.phase
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = message(status, "Succeeded")
elseif phase == "Failed" then
  hs.status = "Degraded"
  local failed = condition(status, "Failed")
  if failed ~= nil and failed.status == "True" and failed.message ~= nil and failed.message ~= "" then
    hs.message = failed.reason .. ": " .. failed.message
  else
    hs.message = message(status, "Failed")
  end
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = message(status, "Suspended")
elseif phase == "Pending" or phase == "Starting" or phase == "Running" or phase == "Restarting" then
  hs.status = "Progressing"
  if status.message ~= nil and status.message ~= "" then
    hs.message = phase .. ": " .. status.message
  else
    hs.message = phase
  end
else
  hs.status = "Unknown"
  hs.message = "Unknown TrainJob phase " .. tostring(phase)
end
return hs

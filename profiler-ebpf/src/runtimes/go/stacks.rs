//! The stack switches of Go's cgo calls and callbacks, as the walker
//! passes them: their rows (`RULE_GO_CGOCALL`, `RULE_GO_CGOCALLBACK`) come
//! from profiler-runtimes' `go::unwind`.

use profiler_common::unwind::{UnwindRule, UserStackEnd};

use crate::machine;
use crate::walk::{self, Step, WalkState};

/// Caller of Go's asmcgocall (amd64) on the system stack: back onto the
/// goroutine's stack, where asmcgocall's return address into
/// runtime.cgocall is (see RULE_GO_CGOCALL): the depth is at SP +
/// cfa_offset, g at SP + param; the SP asmcgocall saved is `ra_offset`
/// bytes below its return address, with the caller's FP at CFA +
/// fp_offset when it pushed one.
#[inline(always)]
pub(crate) fn cgocall_step(state: &mut WalkState, rule: &UnwindRule) -> Result<Step, ()> {
    let depth = walk::read_user(state.sp.wrapping_add(rule.cfa_offset as i64 as u64))?;
    let g = walk::read_user(state.sp.wrapping_add(rule.param as i64 as u64))?;
    let saved_sp = if g == 0 {
        depth
    } else {
        // g.stack.hi: the second word of g (g.stack is its first field in
        // every Go version).
        walk::read_user(g + 8)?.wrapping_sub(depth)
    };
    let cfa = saved_sp.wrapping_add(rule.ra_offset as i64 as u64 + 8);
    if saved_sp == 0 || cfa >= machine::USER_LIMIT {
        return Ok(Step::End(UserStackEnd::TableStop));
    }
    let return_address = walk::read_user(cfa - 8)?;
    if rule.fp_offset != 0 {
        state.fp = walk::read_user(cfa.wrapping_add(rule.fp_offset as i64 as u64))?;
    }
    state.sp = cfa;
    Ok(walk::return_to(state, return_address))
}

/// Go's g register at the sample (a g only if the leaf was Go code).
#[inline(always)]
pub(crate) fn g_register(state: &WalkState) -> u64 {
    state.callee[super::G_REGISTER]
}

/// `g0.sched.sp` of goroutine `g` (the g register at the sample), if `g`
/// is the g whose stack `sp` is on (see RULE_GO_CGOCALLBACK).
#[inline(always)]
pub(crate) fn system_stack_of(g: u64, sp: u64) -> Result<Option<u64>, ()> {
    if g == 0 || g >= machine::USER_LIMIT {
        return Ok(None);
    }
    let bounds = walk::read_pair(g)?; // g.stack.lo, g.stack.hi
    if !(bounds[0] <= sp && sp < bounds[1]) {
        return Ok(None);
    }
    let m = walk::read_user(g + 48)?;
    if m == 0 || m >= machine::USER_LIMIT {
        return Ok(None);
    }
    let g0 = walk::read_user(m)?;
    if g0 == 0 || g0 >= machine::USER_LIMIT {
        return Ok(None);
    }
    let system_sp = walk::read_user(g0 + 56)?;
    Ok((system_sp != 0 && system_sp < machine::USER_LIMIT).then_some(system_sp))
}

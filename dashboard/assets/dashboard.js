/*
 * wabarelay dashboard: progressive enhancements only (every page works without
 * script). Loaded from the dashboard's own origin: the page's CSP allows no
 * inline script.
 *  - [data-copy=ID] buttons copy the value of the input with that id;
 *  - forms with [data-confirm] ask before submitting.
 */
(function () {
  'use strict';
  function copy(btn) {
    var input = document.getElementById(btn.getAttribute('data-copy'));
    if (!input) return;
    var label = btn.textContent;
    function done(ok) {
      btn.textContent = ok ? 'Copied' : 'Press Ctrl+C';
      setTimeout(function () { btn.textContent = label; }, 1500);
    }
    input.select();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(input.value).then(function () { done(true); }, function () { done(false); });
    } else {
      var ok = false;
      try { ok = document.execCommand('copy'); } catch (e) { ok = false; }
      done(ok);
    }
  }
  document.addEventListener('click', function (ev) {
    var btn = ev.target.closest && ev.target.closest('button[data-copy]');
    if (btn) { ev.preventDefault(); copy(btn); }
  });
  document.addEventListener('submit', function (ev) {
    var form = ev.target;
    var msg = form.getAttribute && form.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
})();
